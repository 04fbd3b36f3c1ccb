"""Instructions per chat-loop step, counted by valgrind: a figure a shared machine does not blur.

    python benchmarks/chat_loop_instructions.py [--embedder hash] [--steps 50]
                                                [--mode both|context|add] [--code DIR]

The dev LoCoMo conversation of the chat loop (``chat_loop.CONVERSATION``) is stored up to turn
570 (bulk, then ten messages live), five untimed steps follow, then ``--steps`` steps each add
the next message and ask for the context of one of its questions at 1,000 tokens (``--mode
context``: only the context, no new message; ``add``: only the message). The run happens under
``valgrind --tool=callgrind`` with collection switched on (``callgrind_control -i on``) for those
steps only; the timed flushes are held back (the writer's 2 s timer would fire at valgrind's
speed every few steps) and ``flush_every`` is raised, so every step does the same work.
Reported: instructions per step. ``--code``: a checkout of another commit, put first on
``PYTHONPATH``, to compare. Needs valgrind (Debian's ``valgrind`` package).

Timing is the figure users feel, but on a machine shared with other jobs a step's wall time
moves by 2x between runs; instruction counts repeat to a fraction of a percent, so they say
whether a change made the step do less (docs/chat-loop.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
START = 570


def child(embedder: str, steps: int, mode: str) -> None:
    """Run in valgrind: store the conversation, then the counted steps."""
    sys.path.insert(0, str(HERE))
    import chat_loop
    from locomo_data import load

    import cce_duck
    from cce_duck import writer

    writer.FLUSH_AFTER_S = 1e9  # no timed flush inside the counted steps
    conv = next(c for c in load(Path(os.environ.get(
        "CCE_LOCOMO", "/work/shared/data/locomo_dev.json"))) if c.sample_id == chat_loop.CONVERSATION)
    msgs = [{**m, "timestamp": str(m["timestamp"])} for m in conv.messages]
    questions = [qa["question"] for qa in conv.qa]
    folder = Path(tempfile.mkdtemp(prefix="cce_loop_ir_"))
    try:
        eng = cce_duck.Engine(data_dir=folder, embedder=embedder, durability="os",
                              flush_every=100_000)
        eng.ingest("c", [{k: m[k] for k in ("role", "content", "timestamp", "name")}
                         for m in msgs[: START - 10]])
        for m in msgs[START - 10 : START]:
            eng.add_message("c", m["role"], m["content"], m["timestamp"], m["name"])

        def step(i: int, adds: bool, asks: bool) -> None:
            m = msgs[START + i]
            if adds:
                eng.add_message("c", m["role"], m["content"], m["timestamp"], m["name"])
            if asks:
                eng.context("c", questions[i % len(questions)], max_tokens=1000)

        for i in range(5):
            step(i, True, True)
        toggle = ["callgrind_control", "-i"]
        subprocess.run([*toggle, "on", str(os.getpid())], check=True, capture_output=True)
        for i in range(5, 5 + steps):
            step(i, mode != "context", mode != "add")
        subprocess.run([*toggle, "off", str(os.getpid())], check=True, capture_output=True)
        eng.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def count(embedder: str, steps: int, mode: str, code: Path | None) -> int:
    """Instructions per step of one valgrind run."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", sys.executable, __file__, "--child",
             "--embedder", embedder, "--steps", str(steps), "--mode", mode],
            env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"the counted run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return int(found.group(1)) // steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedder", default="hash")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--mode", choices=["both", "context", "add"], default="both")
    ap.add_argument("--code", type=Path, default=None, help="a checkout of another commit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.embedder, args.steps, args.mode)
        return 0
    per_step = count(args.embedder, args.steps, args.mode, args.code)
    print(f"{per_step:,} instructions per step ({args.embedder}, {args.mode}, {args.steps} steps"
          f"{'' if args.code is None else f', code at {args.code}'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
