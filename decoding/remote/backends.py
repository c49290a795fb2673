"""The wire side of the remote engine: one streaming request per completion, through the ecosystem's
client libraries (`openai` for OpenAI-compatible /v1/completions, `httpx` for llama.cpp's /infill),
and every way it can fail mapped to one sentence a user can act on.

A stream is an async context manager yielding `Chunk`s; leaving it (a stop rule fired, the request
was cancelled or ran past its deadline) closes the HTTP response, and with it the connection, which
is how vLLM, SGLang and llama.cpp's server learn to stop generating.
"""
from __future__ import annotations

import contextlib
import json
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from decoding.remote.spec import RemoteSpec

log = logging.getLogger("draftwise.remote")

# What is wrong with the server, as draftwise/stats reports it.
UNREACHABLE, SLOW, REFUSED, WRONG_MODEL, FAILING = "unreachable", "slow", "refused", "wrong_model", "error"


@dataclass
class Chunk:
    text: str = ""
    finish_reason: str | None = None  # the server's: "stop" (end of text / stop string), "length"
    usage: dict[str, Any] = field(default_factory=dict)  # server-reported counts and timings, when given


class RemoteProblem(Exception):
    """The server could not serve a request; str() is a complete sentence for the user."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _first_line(text: str) -> str:
    return (str(text).strip().splitlines() or [""])[0][:300]


def _cause_chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def transport_problem(exc: BaseException, spec: RemoteSpec) -> RemoteProblem:
    """A connection-level failure (no HTTP answer) as a RemoteProblem."""
    import httpx

    where = spec.url
    for e in _cause_chain(exc):
        if isinstance(e, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(e) or "SSL" in type(e).__name__:
            return RemoteProblem(REFUSED, f"the TLS connection to the inference server at {where} failed "
                                          f"({_first_line(e) or type(e).__name__}); for a private certificate "
                                          f"authority add ?ca=PATH to the target")
    for e in _cause_chain(exc):
        if isinstance(e, httpx.TimeoutException) or type(e).__name__ == "APITimeoutError":
            return RemoteProblem(SLOW, f"the inference server at {where} did not answer within "
                                       f"{spec.timeout_s:g} s")
    for e in _cause_chain(exc):
        if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
            return RemoteProblem(UNREACHABLE, f"the inference server at {where} closed the connection "
                                              f"mid-answer ({_first_line(e) or type(e).__name__})")
        if isinstance(e, (httpx.ConnectError, ConnectionError, OSError)):
            why = _first_line(e) or type(e).__name__
            if "refused" in why.lower():
                why = "connection refused"
            return RemoteProblem(UNREACHABLE, f"cannot reach the inference server at {where} ({why})")
    return RemoteProblem(UNREACHABLE, f"cannot reach the inference server at {where} "
                                      f"({_first_line(exc) or type(exc).__name__})")


def status_problem(status: int, detail: str, spec: RemoteSpec) -> RemoteProblem:
    detail = _first_line(detail)
    if status in (401, 403):
        return RemoteProblem(REFUSED, f"the inference server at {spec.url} refused the API key (HTTP {status}); "
                                      f"set it in the environment variable {spec.api_key_env}")
    if status == 404 and spec.model and ("model" in detail.lower() or not detail):
        return RemoteProblem(WRONG_MODEL, f"the inference server at {spec.url} does not serve a model named "
                                          f"'{spec.model}' (HTTP 404{': ' + detail if detail else ''})")
    if status in (502, 503, 504):
        return RemoteProblem(UNREACHABLE, f"the inference server at {spec.url} is not ready (HTTP {status}"
                                          f"{': ' + detail if detail else ''})")
    return RemoteProblem(FAILING, f"the inference server at {spec.url} answered HTTP {status}"
                                  f"{': ' + detail if detail else ''}")


def _openai_detail(err) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner.get("detail") or "")
        return str(body.get("detail") or inner or "")
    return getattr(err, "message", "") or ""


def _timeout(spec: RemoteSpec):
    import httpx

    # connecting should take milliseconds on a LAN; reading waits up to the request's deadline
    return httpx.Timeout(spec.timeout_s, connect=min(5.0, spec.timeout_s))


def _verify(spec: RemoteSpec):
    if spec.ca:
        return ssl.create_default_context(cafile=spec.ca)
    return True


class OpenAIBackend:
    """OpenAI-compatible /v1/completions, streamed (the prompt is draftwise's own FIM prompt text)."""

    api = "openai"

    def __init__(self, spec: RemoteSpec, api_key: str | None) -> None:
        import httpx
        import openai

        self.spec = spec
        self._openai = openai
        self.client = openai.AsyncOpenAI(
            base_url=spec.url, api_key=api_key or "none", max_retries=0, timeout=_timeout(spec),
            http_client=httpx.AsyncClient(timeout=_timeout(spec), verify=_verify(spec)))

    async def models(self) -> list[str]:
        try:
            page = await self.client.models.list()
            return [m.id for m in page.data]
        except self._openai.APIStatusError as err:
            raise status_problem(err.status_code, _openai_detail(err), self.spec) from None
        except self._openai.APIConnectionError as err:
            raise transport_problem(err, self.spec) from None

    @contextlib.asynccontextmanager
    async def stream(self, *, prompt: str, max_tokens: int, temperature: float, top_p: float, top_k: int,
                     seed: int | None, stop: list[str], **_: Any) -> AsyncIterator[AsyncIterator[Chunk]]:
        import httpx

        openai = self._openai
        extra = {"repeat_penalty": 1.0}  # llama.cpp servers penalise repeats by default; greedy means greedy
        if top_k:
            extra["top_k"] = top_k
        try:
            response = await self.client.completions.create(
                model=self.spec.model, prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                top_p=top_p, seed=seed, stop=stop[:4] or None, stream=True,
                stream_options={"include_usage": True}, extra_body=extra)
        except openai.APIStatusError as err:
            raise status_problem(err.status_code, _openai_detail(err), self.spec) from None
        except openai.APIConnectionError as err:
            raise transport_problem(err, self.spec) from None

        async def chunks() -> AsyncIterator[Chunk]:
            try:
                async for event in response:
                    usage = event.usage.model_dump() if getattr(event, "usage", None) else {}
                    if not event.choices:
                        if usage:
                            yield Chunk(usage=usage)
                        continue
                    choice = event.choices[0]
                    yield Chunk(choice.text or "", choice.finish_reason, usage)
            except openai.APIError as err:  # an error event inside the stream
                raise RemoteProblem(FAILING, f"the inference server at {self.spec.url} failed mid-answer: "
                                             f"{_first_line(getattr(err, 'message', err))}") from None
            except httpx.TransportError as err:
                raise transport_problem(err, self.spec) from None

        try:
            yield chunks()
        finally:
            await response.close()  # closing the connection is what makes the server stop

    async def close(self) -> None:
        await self.client.close()


class LlamaCppInfillBackend:
    """llama.cpp's native /infill: the server builds the FIM prompt from prefix, suffix and the other
    files (`input_extra`) with the model's own tokens, and streams server-sent events."""

    api = "llamacpp"

    def __init__(self, spec: RemoteSpec, api_key: str | None) -> None:
        import httpx

        self.spec = spec
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=spec.url, headers=headers, timeout=_timeout(spec),
                                        verify=_verify(spec))

    async def _check(self, response) -> None:
        if response.status_code >= 400:
            body = (await response.aread()).decode("utf-8", "replace")
            try:
                parsed = json.loads(body)
                err = parsed.get("error", parsed)
                detail = err.get("message", "") if isinstance(err, dict) else str(err)
            except (ValueError, AttributeError):
                detail = body
            raise status_problem(response.status_code, detail, self.spec)

    async def models(self) -> list[str]:
        import httpx

        try:
            response = await self.client.get("/v1/models")
            await self._check(response)
            return [m.get("id", "") for m in response.json().get("data", [])]
        except httpx.TransportError as err:
            raise transport_problem(err, self.spec) from None

    @contextlib.asynccontextmanager
    async def stream(self, *, prefix: str, suffix: str, extra: list[dict], max_tokens: int, temperature: float,
                     top_p: float, top_k: int, seed: int | None, stop: list[str],
                     **_: Any) -> AsyncIterator[AsyncIterator[Chunk]]:
        import httpx

        body: dict[str, Any] = {
            "input_prefix": prefix, "input_suffix": suffix, "input_extra": extra, "prompt": "",
            "n_predict": max_tokens, "stream": True, "cache_prompt": True, "temperature": temperature,
            "top_p": top_p, "top_k": top_k or (1 if temperature == 0 else 40), "repeat_penalty": 1.0,
            "stop": stop}
        if seed is not None:
            body["seed"] = seed
        if self.spec.model:
            body["model"] = self.spec.model
        try:
            async with self.client.stream("POST", "/infill", json=body) as response:
                await self._check(response)

                async def chunks() -> AsyncIterator[Chunk]:
                    try:
                        async for line in response.aiter_lines():
                            if not line.startswith("data:"):
                                continue
                            data = line[5:].strip()
                            if data == "[DONE]":
                                return
                            event = json.loads(data)
                            if "error" in event:
                                err = event["error"]
                                raise RemoteProblem(FAILING, f"the inference server at {self.spec.url} failed "
                                                             f"mid-answer: {_first_line(err.get('message', err) if isinstance(err, dict) else err)}")
                            usage = {}
                            if event.get("timings"):
                                usage = {**event["timings"], "tokens_predicted": event.get("tokens_predicted"),
                                         "tokens_evaluated": event.get("tokens_evaluated")}
                            finish = None
                            if event.get("stop"):
                                finish = "length" if event.get("stop_type") == "limit" else "stop"
                            yield Chunk(event.get("content", ""), finish, usage)
                    except httpx.TransportError as err:
                        raise transport_problem(err, self.spec) from None

                yield chunks()
        except httpx.TransportError as err:
            raise transport_problem(err, self.spec) from None

    async def close(self) -> None:
        await self.client.aclose()


# The engine's own speculative-decoding counters on its Prometheus endpoint (vLLM names; a server
# without them reports none).
SPECULATION_COUNTERS = {"drafted": "vllm:spec_decode_num_draft_tokens_total",
                        "accepted": "vllm:spec_decode_num_accepted_tokens_total"}


def parse_counters(text: str, names: dict[str, str]) -> dict[str, float]:
    """Prometheus text format: the sum over labels of each named sample."""
    wanted = {metric: key for key, metric in names.items()}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric = line.split("{", 1)[0].split(" ", 1)[0]
        if metric in wanted:
            try:
                out[wanted[metric]] = out.get(wanted[metric], 0.0) + float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue
    return out


async def speculation_counters(spec: RemoteSpec, api_key: str | None) -> dict[str, float] | None:
    """The server's cumulative draft and accepted token counts from /metrics, or None where it has
    no such counters (or no /metrics)."""
    counters = await server_counters(spec, api_key, SPECULATION_COUNTERS)
    return counters if counters is not None and len(counters) == len(SPECULATION_COUNTERS) else None


async def server_counters(spec: RemoteSpec, api_key: str | None, names: dict[str, str]) -> dict[str, float] | None:
    """The named samples of the server's /metrics (those it has), or None without a /metrics."""
    import httpx

    root = spec.url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=2.0, verify=_verify(spec)) as client:
            reply = await client.get(f"{root}/metrics", headers=headers)
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    return parse_counters(reply.text, names)


def make_backend(spec: RemoteSpec, api_key: str | None):
    return OpenAIBackend(spec, api_key) if spec.api == "openai" else LlamaCppInfillBackend(spec, api_key)
