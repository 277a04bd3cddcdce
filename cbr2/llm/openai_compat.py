"""The ``openai`` backend: any OpenAI-compatible server (``vllm serve``, hosted Qwen APIs, OpenAI).

Requests run in a thread pool of ``llm.concurrency``, each with the ``llm.timeout_s`` timeout.
Retries are the ``openai`` client's own, up to ``llm.max_retries`` per request: it retries
request and lock timeouts (408, 409), rate limits (429), server errors (5xx), timeouts and
connection errors, with exponential backoff (0.5 s doubling up to 8 s, less up to 25 % jitter)
or, when the server sends ``Retry-After`` / ``retry-after-ms`` of at most 2 minutes, after that
delay; a server that asks for longer, or says ``x-should-retry: false``, is not retried (the
numbers of openai 3.57; ``pyproject.toml`` asks for any 1.x or later). What the
client does not do is done here: a request that fails for good raises ``LLMRequestError`` naming
the question, the server, the status with the server's own error text, and how many retries
were spent (when the client numbers them); any other 4xx fails at once, since repeating a bad
request cannot help, except a prompt the server says is over the model's context, which is
recorded as that question's ``prompt_too_long`` and the run goes on.

The API key comes from the environment variable named by ``llm.api_key_env``, never from the
config (configs are logged and committed). A local server (``vllm serve`` without
``--api-key``) needs none, so a placeholder is sent there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from cbr2.common.errors import ConfigError
from cbr2.common.records import Completion, Grammar, Prompt
from cbr2.llm.base import Rendering, cut_at_stop, decoding_identity, request_grammar, stop_strings, token_cap

if TYPE_CHECKING:
    from cbr2.config import LLMConfig

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
"""Hosts whose server gets the placeholder key when the key variable is unset."""

PLACEHOLDER_KEY = "EMPTY"
"""The key sent to a local server that checks none (the client refuses to send no key)."""

OFFICIAL_HOST = "api.openai.com"
"""OpenAI's own API: it rejects vLLM's ``chat_template_kwargs``, so that is not sent there."""

CONTEXT_REFUSAL = re.compile(r"context (length|window)", re.IGNORECASE)
"""A 400 whose text says this is a prompt over the model's context (vLLM and OpenAI: "maximum context
length is", llama.cpp's server: "exceed context window"): recorded as ``Completion.overflow``, not raised."""

RETRY_COUNT_HEADER = "x-stainless-retry-count"
"""The request header in which the ``openai`` client numbers its retries (0 on the first try)."""


class LLMRequestError(RuntimeError):
    """A request that failed for good: a non-retryable 4xx, or still failing after all retries."""


def _host(base_url: str | None) -> str:
    """The host name of ``base_url`` (OpenAI's when unset, which is what the client then uses)."""
    if not base_url:
        return OFFICIAL_HOST
    return (urlparse(base_url).hostname or "").lower()


def retries_spent(err: Any) -> int | None:
    """How many retries the client made before the request that raised ``err`` (None when unknown)."""
    request = getattr(err, "request", None)
    try:
        value = request.headers.get(RETRY_COUNT_HEADER) if request is not None else None
        return int(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None


def _server_text(err: Any) -> str:
    """The server's own error text from an ``APIStatusError`` (its JSON ``message``, else the body)."""
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        message = body.get("message")
        if message is None and isinstance(body.get("error"), dict):
            message = body["error"].get("message")
        if message is None and isinstance(body.get("error"), str):
            message = body["error"]
        if message is not None:
            return str(message)
    if body is not None:
        return str(body)
    response = getattr(err, "response", None)
    text = getattr(response, "text", None) if response is not None else None
    return text or str(err)


class OpenAIBackend(Rendering):
    """Generates through an OpenAI-compatible HTTP API with bounded concurrency and the client's retries.

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        grammar: Decode under this grammar (``generation.constrained``), sent as vLLM's
            ``structured_outputs`` request field: a ``vllm serve`` server (or another server that
            takes the field) is needed.

    Raises:
        ValueError: If ``llm.model`` is unset (a server may serve several models), or a grammar
            is asked of the official OpenAI API, which takes no grammar.
    """

    name = "openai"
    capabilities = frozenset({"constrained", "grounded"})
    """The grammar goes with each request (``structured_outputs``), a prompt's own (``Prompt.grammar``)
    for grounded decoding; one completion per request."""

    def __init__(self, cfg: LLMConfig, grammar: Grammar | None = None):
        self.cfg = cfg
        self.grammar = grammar
        model = cfg.model
        if not model:
            raise ConfigError("llm.backend=openai needs llm.model: the model name the server serves "
                             "(e.g. llm.model=Qwen/Qwen3-8B for `vllm serve Qwen/Qwen3-8B`)")
        self.model = str(model)
        self.base_url: str | None = cfg.base_url or None
        self.stop = stop_strings(cfg)
        self._client: Any = None
        if grammar is not None and _host(self.base_url) == OFFICIAL_HOST:
            raise ConfigError("generation.constrained=true needs a server that takes a grammar (vllm serve, with "
                             "llm.base_url); the official OpenAI API does not")

    @property
    def uses_chat(self) -> bool:
        """``llm.chat`` when set, else True (served models are instruction models)."""
        return True if self.cfg.chat is None else bool(self.cfg.chat)

    def identity(self) -> dict[str, Any]:
        """What, beside the prompt, decides the output: the predictions-cache key.

        The server URL is left out on purpose: the same model behind another address or port
        gives the same predictions.
        """
        return decoding_identity(self.cfg, self.grammar, backend=self.name, model=self.model, chat=self.uses_chat)

    def chat_text(self, prompt: Prompt) -> str:
        """The chat messages as they are sent, one block each (the server applies its template)."""
        return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in prompt.messages)

    def api_key(self) -> str:
        """The key from the environment variable ``llm.api_key_env``; a placeholder for a local server.

        Raises:
            ValueError: If the variable is unset and the server is not local.
        """
        env = str(self.cfg.api_key_env)
        key = os.environ.get(env)
        if key:
            return key
        if _host(self.base_url) in LOCAL_HOSTS:
            return PLACEHOLDER_KEY
        raise ConfigError(f"llm.backend=openai: the API key for {self.base_url or 'the OpenAI API'} is read from the "
                         f"environment variable {env} (llm.api_key_env), which is unset; export {env}=... "
                         "(keys never go in configs)")

    def client(self) -> Any:
        """The ``openai.OpenAI`` client, made once: ``llm.timeout_s`` per request, ``llm.max_retries`` retries."""
        if self._client is None:
            key = self.api_key()
            from openai import OpenAI

            self._client = OpenAI(api_key=key, base_url=self.base_url, timeout=float(self.cfg.timeout_s),
                                  max_retries=int(self.cfg.max_retries))
        return self._client

    def request_kwargs(self, prompt: Prompt) -> dict[str, Any]:
        """The arguments of ``chat.completions.create`` (chat mode) or ``completions.create`` for ``prompt``."""
        temperature = float(self.cfg.temperature)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "temperature": temperature,
            "top_p": float(self.cfg.top_p) if temperature > 0 else 1.0,
            "max_tokens": token_cap(self.cfg, self.grammar),
            "seed": int(self.cfg.seed),
        }
        if self.stop:
            kwargs["stop"] = self.stop
        extra: dict[str, Any] = {}
        if self.grammar is not None:
            # vLLM's structured outputs; a grounded prompt's own grammar holds its candidates.
            extra["structured_outputs"] = {"grammar": request_grammar(self.grammar, prompt)}
        if not self.uses_chat:
            kwargs["prompt"] = prompt.text
        else:
            kwargs["messages"] = prompt.messages
            if _host(self.base_url) != OFFICIAL_HOST:
                # vLLM / SGLang pass these to the chat template: Qwen3 answers without a think block.
                extra["chat_template_kwargs"] = {"enable_thinking": False}
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _request(self, prompt: Prompt) -> Completion:
        """One request (the client retries it)."""
        client = self.client()
        kwargs = self.request_kwargs(prompt)
        if self.uses_chat:
            response = client.chat.completions.create(**kwargs)
            text = response.choices[0].message.content or ""
        else:
            response = client.completions.create(**kwargs)
            text = response.choices[0].text or ""
        usage = getattr(response, "usage", None)
        return Completion(
            text=cut_at_stop(text, self.stop),
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
        )

    def _call(self, prompt: Prompt) -> Completion:
        """One prompt's completion; a failure the client's retries did not cure becomes an ``LLMRequestError``.

        Raises:
            LLMRequestError: Naming the question, the server, what failed (the status with the
                server's error text, a timeout, a connection error) and the retries spent.
        """
        import openai

        server = self.base_url or OFFICIAL_HOST
        try:
            return self._request(prompt)
        except openai.APIStatusError as e:
            if e.status_code == 400 and CONTEXT_REFUSAL.search(_server_text(e)):
                return Completion("", overflow=f"{server}: {_server_text(e)}")
            reason = f"HTTP {e.status_code} from {server}: {_server_text(e)}"
            error: Exception = e
        except openai.APITimeoutError as e:
            reason, error = f"request to {server} timed out after {self.cfg.timeout_s} s", e
        except openai.APIConnectionError as e:
            reason, error = f"connection error with {server}: {e}", e
        retries = retries_spent(error)
        after = f" (after {retries} retries)" if retries else ""
        raise LLMRequestError(f"{prompt.qid}: {reason}{after}") from error

    def generate(self, prompts: Sequence[Prompt],
                 on_result: Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """One completion per prompt, in input order, ``llm.concurrency`` requests at a time.

        Args:
            prompts: The prompts of the run.
            on_result: Called as ``on_result(index, completion)`` in the calling thread as each
                result arrives (in completion order), so finished work can be saved at once.

        Returns:
            The completions, each cut at the first stop string.

        Raises:
            LLMRequestError: When a request fails for good. Requests not yet started are
                cancelled; those in flight are awaited and still reported to ``on_result``.
            ValueError: If the API key variable is unset for a non-local server.
        """
        if not prompts:
            return []
        self.client()  # fail on a missing key before starting threads
        results: list[Completion | None] = [None] * len(prompts)
        first_error: Exception | None = None
        pool = ThreadPoolExecutor(max_workers=max(1, int(self.cfg.concurrency)),
                                  thread_name_prefix="cbr2-openai")
        try:
            futures: dict[Future, int] = {pool.submit(self._call, p): i for i, p in enumerate(prompts)}
            for future in as_completed(futures):
                try:
                    completion = future.result()
                except CancelledError:
                    continue
                except Exception as e:  # noqa: BLE001 - re-raised below, once the requests in flight are kept
                    if first_error is None:
                        first_error = e
                        for f in futures:
                            f.cancel()
                    continue
                index = futures[future]
                results[index] = completion
                if on_result is not None:
                    on_result(index, completion)
        finally:
            # Also reached when on_result raises: requests not yet started are dropped.
            pool.shutdown(wait=True, cancel_futures=True)
        if first_error is not None:
            raise first_error
        return [r for r in results if r is not None]
