"""The rules `decide` holds a command to, one idea a module.

`fields` checks that a command is well-formed, before any rule reads the run; `context` is what
every rule is given (the run, the time, the limits) and the refusals all families share; `runs`,
`steps`, `waits` and `hooks` hold the rules of the commands of each family, each module with its
table of the rule of each command class.
"""
