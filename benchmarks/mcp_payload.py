"""How many characters the MCP server makes a model read: ``tools/list`` and a context result.

    python benchmarks/mcp_payload.py [--budget 300] [--json out.json]

Starts ``cce serve mcp`` (hash embedder, a temporary data folder) with the official client,
stores the bundled sample conversation, and measures the ``tools/list`` result and the
``cce_retrieve_context`` result for the sample's question (the text content a model reads, and
the whole result as JSON), with and without ``explain``, beside the context text itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult

import cce_duck


def _text(res: CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in res.content)


async def measure(data_dir: Path, budget: int) -> dict[str, Any]:
    sample = json.loads((files("cce_duck.data") / "sample_conversation.json").read_text("utf-8"))
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "cce_duck.cli", "serve", "mcp"],
        env={**os.environ, "CCE_DATA_DIR": str(data_dir), "CCE_EMBEDDER": "hash"})
    with (data_dir.parent / "stderr.txt").open("w") as err:
        async with stdio_client(params, errlog=err) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            res = await session.call_tool("cce_ingest_history", {
                "session_id": "demo", "messages": sample["messages"]})
            assert not res.is_error, _text(res)
            out: dict[str, Any] = {
                "tools": len(tools.tools),
                "tools_list_chars": len(tools.model_dump_json(by_alias=True, exclude_none=True)),
            }
            for explain in (False, True):
                res = await session.call_tool("cce_retrieve_context", {
                    "session_id": "demo", "query": sample["question"], "max_tokens": budget,
                    "explain": explain})
                assert not res.is_error, _text(res)
                data = res.structured_content or json.loads(_text(res))
                key = "explain" if explain else "default"
                out[key] = {"context_chars": len(data["context"]),
                            "result_text_chars": len(_text(res)),
                            "result_json_chars": len(res.model_dump_json(by_alias=True,
                                                                         exclude_none=True))}
            return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=300, help="max_tokens of the context (300)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cce_mcp_size_") as tmp:
        data_dir = Path(tmp) / "data"
        figures = asyncio.run(measure(data_dir, args.budget))
    report = {"benchmark": "mcp_payload", "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "cce_duck_version": cce_duck.__version__, "budget": args.budget,
              "command": "python " + " ".join(sys.argv), **figures}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
