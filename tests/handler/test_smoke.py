from runfold import CommandHandler
from runfold.commands import CreateRun, StartRun
from tests.conftest import Clock


async def test_create_and_start(handler: CommandHandler, clock: Clock) -> None:
    outcome = await handler.execute("r1", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
    assert outcome.snapshot.status == "running"
    assert [e.sequence for e in outcome.appended] == [1, 2]
    assert (await handler.snapshot("r1")).last_sequence == 2
