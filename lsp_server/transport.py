"""Messages off the wire: the base protocol's headers and bodies, over stdio or TCP.

pygls' own reader matches `Content-Length` case-sensitively, and after a header block without a
usable length it reads the next message's header as part of a lost body, so that every later
message is lost too. This reader takes header names in any case (LSP headers follow HTTP's), and
after a bad message it finds the next `Content-Length` header, even glued to the end of the body
it could not read. An unparsable body is answered with ParseError.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
from typing import AsyncIterator, Protocol

from pygls.exceptions import JsonRpcParseError
from pygls.io_ import StdinAsyncReader, StdoutWriter

from decoding.errors import DraftwiseError
from lsp_server.protocol import DraftwiseProtocol

log = logging.getLogger(__name__)

# Matches the header wherever it starts in a line: after an unreadable body, the next message's
# header follows the body's last byte on the same line.
CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)
# Larger than any document an editor sends; a header claiming more is treated as garbage rather
# than waited (and allocated) for.
MAX_MESSAGE_BYTES = 512 << 20


class Reader(Protocol):
    async def readline(self) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...


async def read_bodies(reader: Reader) -> AsyncIterator[bytes]:
    """Each message body in turn, until end of input."""
    while True:
        length: int | None = None
        header_seen = False
        while True:  # one header block
            try:
                line = await reader.readline()
            except ValueError:  # an asyncio stream's line limit: junk, skip it
                header_seen = True
                continue
            if not line:
                return
            found = CONTENT_LENGTH.search(line)
            if found is not None and found.start() > 0 and line[:found.start()].strip():
                log.warning("skipped %d bytes of unreadable input before a message", found.start())
                line, found = line[found.start():], CONTENT_LENGTH.match(line[found.start():])
            if not line.strip():
                if header_seen:
                    break
                continue  # blank lines between messages
            header_seen = True
            if found is not None and not line[:found.start()].strip():
                value = found.group(1).strip()
                usable = value.isdigit() and len(value) <= 12 and int(value) <= MAX_MESSAGE_BYTES
                length = int(value) if usable else None
                if length is None:
                    log.warning("unusable header %r; skipping to the next message", line[:80])
        if length is None:
            continue  # the body that follows is read as junk lines until the next header
        try:
            body = await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            return
        if len(body) < length:  # stdin at end of input
            return
        yield body


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse(body: bytes, protocol: DraftwiseProtocol) -> None:
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError; nesting too deep
        log.warning("unparsable message (%d bytes): %s", len(body), err)
        protocol.send_error(None, JsonRpcParseError(f"Parse error: {err}"))
        return
    protocol.receive(data)


async def serve(reader: Reader, protocol: DraftwiseProtocol) -> int:
    """Handle messages until `exit` or end of input; the process exit code LSP asks for."""
    async for body in read_bodies(reader):
        try:
            parse(body, protocol)
        except BrokenPipeError:
            raise
        except Exception:  # a bug in handling one message must not end the session
            log.exception("failed to handle a message")
        if protocol.exit_code is not None:
            return protocol.exit_code
    log.info("the client closed the connection")
    return 0 if protocol.shutdown_received else 1


def serve_stdio(server, stdin, stdout) -> int:
    server.protocol.set_writer(StdoutWriter(stdout))
    try:
        return asyncio.run(serve(StdinAsyncReader(stdin, server.thread_pool), server.protocol))
    except BrokenPipeError:
        log.error("the client closed its end of the connection")
        return 0 if server.protocol.shutdown_received else 1


def is_loopback(host: str) -> bool:
    """Whether host is this machine only: `localhost`, all of 127.0.0.0/8, or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve anywhere
        return False


def check_listen_host(host: str, allow_remote: bool) -> None:
    """Refuse a non-loopback listening address unless remote connections are explicitly allowed."""
    if not allow_remote and not is_loopback(host):
        raise DraftwiseError(f"refusing to listen on {host}: the server has no authentication, so anyone "
                             f"who can reach that address could read your open files. Use a loopback "
                             f"address (127.0.0.1), or allow remote connections with --allow-remote.")


def serve_tcp(server, host: str, port: int) -> int:
    """One client session on host:port, like stdio; further connections are refused while it lasts."""
    async def main() -> int:
        session: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if server.protocol.writer is not None:
                log.warning("refused a second connection from %s", writer.get_extra_info("peername"))
                writer.close()
                return
            log.info("client connected from %s", writer.get_extra_info("peername"))
            server.protocol.set_writer(writer)
            try:
                code = await serve(reader, server.protocol)
            except (BrokenPipeError, ConnectionError):
                code = 0 if server.protocol.shutdown_received else 1
            writer.close()
            if not session.done():
                session.set_result(code)

        listener = await asyncio.start_server(connected, host, port)
        log.info("listening on %s", ", ".join(str(s.getsockname()) for s in listener.sockets))
        async with listener:
            return await session

    return asyncio.run(main())
