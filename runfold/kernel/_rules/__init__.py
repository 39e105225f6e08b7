"""The rules `decide` holds a command to, one idea a module.

`fields` checks that a command is well-formed before any rule reads the run.
"""
