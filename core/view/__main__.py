"""``python -m core.view RUN_DIR [--port N] [--static OUT.html]``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from core.errors import ConfigError


def _steps(text: str) -> int | None:
    if text == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps takes a number or 'all', got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"--steps must be >= 0, got {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m core.view",
        description="Serve a run's dashboard and trajectory viewer on this machine, or write it as one HTML file.",
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (run_dir of python -m core.train)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    parser.add_argument("--static", type=Path, metavar="OUT.html", help="write a self-contained page and exit")
    parser.add_argument(
        "--steps",
        type=_steps,
        default=20,
        help="with --static: embed the last N stored training steps (default 20; 'all'); evals are always embedded",
    )
    args = parser.parse_args(argv)

    from core.view.data import RunData
    from core.view.page import render_page
    from core.view.server import ViewServer

    try:
        if args.static is not None:
            data = RunData(args.run_dir)
            page, _ = render_page(data=data.export(args.steps), title=f"tracerl · {data.run_dir.name}")
            args.static.parent.mkdir(parents=True, exist_ok=True)
            args.static.write_text(page, encoding="utf-8")
            print(f"wrote {args.static} ({len(page.encode()) / 1e6:.1f} MB); open it in a browser, no server needed")
            return 0
        try:
            server = ViewServer(args.run_dir, args.host, args.port)
        except OSError as exc:
            print(f"error: cannot listen on {args.host}:{args.port} ({exc}); try --port 0", file=sys.stderr)
            return 2
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: anyone who can reach it can read the run's traces", file=sys.stderr)
    print(f"viewing {server.data.run_dir} at {server.url} (Ctrl-C stops)", flush=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the way to stop it
            server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
