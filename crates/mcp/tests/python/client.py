"""Drives `sandboxctl mcp` with the official MCP Python SDK, as an MCP client would.

    client.py stdio SANDBOXCTL ARG...   spawns the server and speaks MCP on its stdin/stdout
    client.py http URL                  speaks streamable HTTP to a running server

The scenario: list the tools and the resource template, create a sandbox, upload a script and
its input, run it (it writes an output file; its output arrives as progress notifications
too), download the output, check file_exists and list_files, read the session's sandboxes
resource, provoke the errors an LLM must be able to act on, ask for results too large for one
MCP message (output and a file of control characters, a listing of thousands of long names),
and delete the sandbox.

Prints one JSON object on stdout, the transcript (names that change from run to run
replaced), which the Rust test compares with what it expects. A step whose result does not
have the expected shape raises, and the script exits non-zero.
"""

import asyncio
import base64
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

POOL = "python-sandbox-pool"
NAMESPACE = "default"

JOB = """\
import pathlib, sys
text = pathlib.Path("work/input.txt").read_text()
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/result.txt").write_text(text.upper())
for i in range(3):
    print("line", i, flush=True)
print("to stderr", file=sys.stderr)
"""

BLOB = bytes([0, 1, 2, 255, 254])

# The most one tool result may take on the wire: the SDK's streamable HTTP client refuses a
# server-sent event larger than this (the call then fails), and stdio clients meet the same
# servers.
MESSAGE_LIMIT = 1024 * 1024

# Output of control characters, which JSON escapes to six bytes each (and the copy of the
# structured content in the text block to seven): 200 kB of each kind on each stream.
CONTROL_OUTPUT = "head -c 200000 /dev/zero; head -c 200000 /dev/zero | tr '\\0' '\\1' >&2"
# A text file of 256 KiB (download_file's default limit) of such characters.
CONTROL_FILE = "head -c 262144 /dev/zero | tr '\\0' '\\1' > work/control.txt"
# 5000 empty files with names of 200 characters.
MANY_FILES = (
    "python3 -c \"import os; os.makedirs('many'); "
    "[open('many/%05d' % i + 'x' * 195, 'w').close() for i in range(5000)]\""
)


def text_of(result):
    return "".join(block.text for block in result.content if getattr(block, "type", "") == "text")


async def call(session, name, arguments, progress=None):
    """A tool call that must succeed: its structured content."""
    result = await session.call_tool(name, arguments, progress_callback=progress)
    if result.is_error:
        raise AssertionError(f"{name}({arguments}) failed: {text_of(result)}")
    if not isinstance(result.structured_content, dict):
        raise AssertionError(f"{name}: no structured content: {result}")
    return result.structured_content


async def fails(session, name, arguments):
    """A tool call that must fail as a tool result (isError), not a protocol error: its text."""
    result = await session.call_tool(name, arguments)
    if not result.is_error:
        raise AssertionError(f"{name}({arguments}) should have failed: {result}")
    return text_of(result)


def first_sentence(text):
    return text.split(". ")[0]


def encoded_size(result):
    """Bytes of the result as JSON, as the server sends it (both copies of its content)."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


async def limits(session, target):
    """Results that would not fit in one message are cut or refused, and say so."""
    output = await session.call_tool("execute_command", {**target, "command": CONTROL_OUTPUT})
    if output.is_error:
        raise AssertionError(f"execute_command failed: {text_of(output)}")
    out = output.structured_content
    await call(session, "execute_command", {**target, "command": CONTROL_FILE})
    text_file = await session.call_tool("download_file", {**target, "path": "work/control.txt"})
    binary_file = await session.call_tool(
        "download_file", {**target, "path": "work/control.txt", "binary": True}
    )
    await call(session, "execute_command", {**target, "command": MANY_FILES})
    listing = await session.call_tool("list_files", {**target, "path": "many", "max_entries": 10000})
    listed = listing.structured_content
    return {
        "output": {
            "fits": encoded_size(output) <= MESSAGE_LIMIT,
            "stdout_truncated": out["stdout_truncated"],
            "stderr_truncated": out["stderr_truncated"],
            "says_why": all("(all that fits in one MCP result)" in out[k] for k in ("stdout", "stderr")),
        },
        "text_file": {
            "fits": encoded_size(text_file) <= MESSAGE_LIMIT,
            "is_error": text_file.is_error,
            "says": text_of(text_file).split(", but")[0],
            "advice": "binary=true" in text_of(text_file),
        },
        "binary_file": {
            "fits": encoded_size(binary_file) <= MESSAGE_LIMIT,
            "bytes_read": binary_file.structured_content["bytes_read"],
        },
        "listing": {
            "fits": encoded_size(listing) <= MESSAGE_LIMIT,
            "total_entries": listed["total_entries"],
            "truncated": listed["truncated"],
            "some": 0 < len(listed["entries"]) < listed["total_entries"],
        },
    }


async def scenario(session):
    transcript = {}
    init = await session.initialize()
    transcript["server"] = init.server_info.name
    tools = await session.list_tools()
    transcript["tools"] = sorted(tool.name for tool in tools.tools)
    templates = await session.list_resource_templates()
    transcript["templates"] = [t.uri_template for t in templates.resource_templates]

    created = await call(session, "create_sandbox", {"warmpool": POOL, "namespace": NAMESPACE})
    claim = created.pop("sandbox_claim_name")
    if not claim.startswith("sandbox-claim-"):
        raise AssertionError(f"unexpected claim name {claim!r}")
    transcript["created"] = created
    target = {"sandbox_claim_name": claim, "namespace": NAMESPACE}

    def scrub(text):
        return text.replace(claim, "<claim>")

    transcript["uploads"] = [
        await call(session, "upload_file", {**target, "path": "work/input.txt", "content": "hello from mcp\n"}),
        await call(session, "upload_file", {**target, "path": "work/job.py", "content": JOB}),
        await call(
            session,
            "upload_file",
            {**target, "path": "work/blob.bin", "content": base64.b64encode(BLOB).decode(), "binary": True},
        ),
    ]

    progress = []

    async def on_progress(value, total, message):
        progress.append((value, message or ""))

    transcript["exec"] = await call(
        session,
        "execute_command",
        {**target, "command": "python3 work/job.py", "timeout": 60},
        progress=on_progress,
    )
    streamed = "".join(message for _, message in progress)
    values = [value for value, _ in progress]
    transcript["progress"] = {
        "saw_stdout": "line 2" in streamed,
        "saw_stderr": "[stderr] to stderr" in streamed,
        "increasing": values == sorted(set(values)) and len(values) > 0,
    }

    transcript["download"] = await call(session, "download_file", {**target, "path": "out/result.txt"})
    transcript["not_text"] = first_sentence(
        await fails(session, "download_file", {**target, "path": "work/blob.bin"})
    )
    blob = await call(session, "download_file", {**target, "path": "work/blob.bin", "binary": True})
    transcript["blob_round_trip"] = base64.b64decode(blob["content"]) == BLOB and blob["bytes_read"] == len(BLOB)

    transcript["exists"] = [
        (await call(session, "file_exists", {**target, "path": path}))["exists"]
        for path in ["out/result.txt", "out", "no/such/file"]
    ]
    listed = await call(session, "list_files", {**target, "path": "out"})
    for entry in listed["entries"]:
        if not isinstance(entry.pop("mod_time"), float):
            raise AssertionError(f"mod_time is not a float: {listed}")
    transcript["list_out"] = listed
    work = await call(session, "list_files", {**target, "path": "work", "max_entries": 2})
    transcript["list_work"] = {
        "names": [e["name"] for e in work["entries"]],
        "total_entries": work["total_entries"],
        "truncated": work["truncated"],
    }

    resource = await session.read_resource(f"sandboxes://{NAMESPACE}")
    transcript["resource"] = [scrub(name) for name in json.loads(resource.contents[0].text)]

    transcript["errors"] = {
        "foreign_claim": first_sentence(
            await fails(
                session,
                "execute_command",
                {"sandbox_claim_name": "sandbox-claim-nope", "namespace": NAMESPACE, "command": "true"},
            )
        ),
        "bad_timeout": first_sentence(
            await fails(session, "execute_command", {**target, "command": "true", "timeout": 0})
        ),
        "missing_argument": first_sentence(await fails(session, "execute_command", target)),
        "escaping_path": scrub(
            first_sentence(await fails(session, "download_file", {**target, "path": "../../etc/passwd"}))
        ),
        "missing_file": scrub(
            first_sentence(await fails(session, "download_file", {**target, "path": "no/such/file"}))
        ),
        "timed_out": first_sentence(
            await fails(session, "execute_command", {**target, "command": "sleep 30", "timeout": 1})
        ),
    }

    transcript["limits"] = await limits(session, target)

    deleted = await call(session, "delete_sandbox", target)
    deleted["sandbox_claim_name"] = scrub(deleted["sandbox_claim_name"])
    transcript["deleted"] = deleted
    transcript["after_delete"] = scrub(
        first_sentence(await fails(session, "execute_command", {**target, "command": "true"}))
    )
    resource = await session.read_resource(f"sandboxes://{NAMESPACE}")
    transcript["resource_after_delete"] = json.loads(resource.contents[0].text)
    return transcript


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        server = StdioServerParameters(command=sys.argv[2], args=sys.argv[3:], env=dict(os.environ))
        async with stdio_client(server) as (read, write):
            async with ClientSession(read, write) as session:
                transcript = await scenario(session)
    elif mode == "http":
        async with streamable_http_client(sys.argv[2]) as (read, write):
            async with ClientSession(read, write) as session:
                transcript = await scenario(session)
    else:
        raise SystemExit(f"unknown mode {mode!r}: stdio or http")
    print(json.dumps(transcript, sort_keys=True))


if __name__ == "__main__":
    asyncio.run(main())
