"""A worker in a child process (scenario worker-killed): its handler writes a line to the file
named by argv[2] when it starts, then runs until the process is killed."""

import asyncio
import os
import sys
from pathlib import Path

import kairos


async def main(queue: str, started: Path) -> None:
    tls = None
    if os.environ.get("KAIROS_CA_CERT"):
        tls = kairos.Tls(
            ca_cert=os.environ["KAIROS_CA_CERT"],
            client_cert=os.environ["KAIROS_CLIENT_CERT"],
            client_key=os.environ["KAIROS_CLIENT_KEY"],
        )
    async with kairos.Client(tls=tls) as client:
        worker = kairos.Worker(client, queue, concurrency=1, worker_id="py-child")

        @worker.handler(None)
        async def hang(task: kairos.Task) -> None:
            with started.open("a") as f:
                f.write(f"{task.execution_id} {task.attempt}\n")
            await asyncio.sleep(3600)

        await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
