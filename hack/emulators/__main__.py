"""`python -m hack.emulators --kubeconfig FILE [--ready-file FILE]` from the repository root."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
import pathlib
import signal

from . import operands
from .api import Api
from .emulator import Emulator
from .profile import profile


def dump_tasks() -> None:
    """SIGUSR1: where every task waits (to the log), for debugging a stuck emulation."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=6, file=out)
    logging.getLogger("emulators").info("%d tasks:\n%s", len(asyncio.all_tasks()), out.getvalue())


async def main_async(args: argparse.Namespace) -> None:
    api = Api.from_kubeconfig(args.kubeconfig)
    emulator = Emulator(api, profile(args.profile, args.time_scale), args.ready_file)
    task = asyncio.create_task(emulator.run())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await emulator.stop()
    await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="emulators", description=__doc__)
    parser.add_argument("--kubeconfig", type=pathlib.Path, required=True)
    parser.add_argument("--ready-file", type=pathlib.Path, help="touched once the initial state is synced")
    parser.add_argument("--profile", default=os.environ.get("SIM_PROFILE") or "instant")
    parser.add_argument("--time-scale", type=float, default=float(os.environ.get("SIM_TIME_SCALE") or 1.0))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.ready_file:
        args.ready_file.unlink(missing_ok=True)
    logging.getLogger("emulators").info("starting; operands: %s", ", ".join(operands.NAMES))
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
