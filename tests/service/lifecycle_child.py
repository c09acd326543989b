"""Child process for the signal tests: a Lifecycle with real signal handling and sd_notify."""

from __future__ import annotations

import asyncio
import sys

from jobdiagd.logsetup import configure_logging
from jobdiagd.service.lifecycle import Lifecycle
from jobdiagd.service.sdnotify import SdNotifier


def say(text: str) -> None:
    print(text, flush=True)


async def main() -> None:
    configure_logging("info", stream=sys.stderr)  # keep stdout for the test's markers
    lc = Lifecycle(sd=SdNotifier.from_env(), on_reload=lambda: say("RELOADED"), stop_seconds=5.0)

    async def setup_a() -> None:
        say("setup a")

    async def cleanup_a() -> None:
        say("cleanup a")

    async def setup_b() -> None:
        say("setup b")

    async def cleanup_b() -> None:
        say("cleanup b")

    async def ticker() -> None:
        # Cooperative loop: finishes its "tick", then notices the stop.
        while not await lc.sleep(0.05):
            pass
        say("ticker drained")

    async def stubborn() -> None:
        await asyncio.Event().wait()  # never looks at the stop flag: must be cancelled

    lc.add_step("a", setup_a, cleanup_a)
    lc.add_step("b", setup_b, cleanup_b)
    lc.add_task("ticker", ticker)
    lc.add_task("stubborn", stubborn)
    await lc.run(handle_signals=True)
    say(f"exit reason={lc.stop_reason}")


if __name__ == "__main__":
    asyncio.run(main())
