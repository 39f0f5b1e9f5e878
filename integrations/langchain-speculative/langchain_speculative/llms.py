"""``SpeculativeLLM``: a LangChain text-completion model over any speculative-llm backend."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.language_models.base import LangSmithParams
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from langchain_speculative._convert import to_generation, to_generation_chunk
from langchain_speculative._params import SpeculativeParams
from speculative_llm.types import Completion, GenerationRequest

__all__ = ["SpeculativeLLM"]


class SpeculativeLLM(SpeculativeParams, BaseLLM):
    """Text-completion model (prompt in, text out) that decodes speculatively.

    Each generation's ``generation_info`` holds ``model_name``, ``finish_reason``,
    ``usage_metadata``, ``speculative`` (``SpecStats.to_dict()``) and, with
    ``token_provenance=True``, ``speculative_tokens`` (text and provenance of every
    token). The prompt is sent as is, without a chat template.

    Instantiate:
        .. code-block:: python

            from langchain_speculative import SpeculativeLLM

            llm = SpeculativeLLM(backend="local", speculative="ngram", max_tokens=64)
            llm.invoke("def fibonacci(n):")

    Stream:
        .. code-block:: python

            for text in llm.stream("def fibonacci(n):"):
                print(text, end="")
    """

    @property
    def _llm_type(self) -> str:
        return "speculative-llm"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return self._ls_params("llm", stop, **kwargs)

    # ---- helpers ---------------------------------------------------------------------------

    def _prompt_request(
        self, prompt: str, stop: list[str] | None, **kwargs: Any
    ) -> GenerationRequest:
        # The backend checks the request (Backend.stream's contract), once.
        return self._build_request(messages=None, prompt=prompt, stop=stop, **kwargs)

    @staticmethod
    def _result(generations: list[Generation], model_name: str) -> LLMResult:
        return LLMResult(
            generations=[[generation] for generation in generations],
            llm_output={"model_name": model_name},
        )

    def _completed(
        self, requests: list[GenerationRequest], completions: list[Completion]
    ) -> LLMResult:
        """The result of prompts sent at once, each with its completion."""
        return self._result(
            [
                to_generation(
                    completion,
                    model_name=self._response_model_name(request),
                    provenance=self.token_provenance,
                )
                for request, completion in zip(requests, completions, strict=True)
            ],
            self.resolved_model_name,
        )

    @staticmethod
    def _as_generation(chunk: GenerationChunk) -> Generation:
        return Generation(text=chunk.text, generation_info=chunk.generation_info)

    # ---- generation ------------------------------------------------------------------------

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        if len(prompts) > 1 and not self.streaming:
            # At once, so that an engine that batches (max_batch > 1) runs them together.
            requests = [self._prompt_request(prompt, stop, **kwargs) for prompt in prompts]
            with ThreadPoolExecutor(max_workers=len(requests)) as pool:
                futures = [
                    pool.submit(contextvars.copy_context().run, self.client.generate, request)
                    for request in requests
                ]
                completions = [future.result() for future in futures]
            return self._completed(requests, completions)
        generations: list[Generation] = []
        for prompt in prompts:
            if self.streaming:
                merged: GenerationChunk | None = None
                for chunk in self._stream(prompt, stop=stop, run_manager=run_manager, **kwargs):
                    merged = chunk if merged is None else merged + chunk
                assert merged is not None  # _stream always yields a closing chunk
                generations.append(self._as_generation(merged))
                continue
            request = self._prompt_request(prompt, stop, **kwargs)
            completion = self.client.generate(request)
            generations.append(
                to_generation(
                    completion,
                    model_name=self._response_model_name(request),
                    provenance=self.token_provenance,
                )
            )
        return self._result(generations, self.resolved_model_name)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        if len(prompts) > 1 and not self.streaming:
            # At once, so that an engine that batches (max_batch > 1) runs them together.
            requests = [self._prompt_request(prompt, stop, **kwargs) for prompt in prompts]
            completions = await asyncio.gather(
                *(self.client.agenerate(request) for request in requests)
            )
            return self._completed(requests, completions)
        generations: list[Generation] = []
        for prompt in prompts:
            if self.streaming:
                merged: GenerationChunk | None = None
                async for chunk in self._astream(
                    prompt, stop=stop, run_manager=run_manager, **kwargs
                ):
                    merged = chunk if merged is None else merged + chunk
                assert merged is not None  # _astream always yields a closing chunk
                generations.append(self._as_generation(merged))
                continue
            request = self._prompt_request(prompt, stop, **kwargs)
            completion = await self.client.agenerate(request)
            generations.append(
                to_generation(
                    completion,
                    model_name=self._response_model_name(request),
                    provenance=self.token_provenance,
                )
            )
        return self._result(generations, self.resolved_model_name)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        # BaseLLM does not fire on_llm_new_token for us: do it for every chunk.
        request = self._prompt_request(prompt, stop, **kwargs)
        model_name = self._response_model_name(request)
        for chunk in self._chunks(request):
            generation_chunk = to_generation_chunk(
                chunk, model_name=model_name, provenance=self.token_provenance
            )
            if run_manager is not None:
                run_manager.on_llm_new_token(generation_chunk.text, chunk=generation_chunk)
            yield generation_chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        request = self._prompt_request(prompt, stop, **kwargs)
        model_name = self._response_model_name(request)
        async for chunk in self._achunks(request):
            generation_chunk = to_generation_chunk(
                chunk, model_name=model_name, provenance=self.token_provenance
            )
            if run_manager is not None:
                await run_manager.on_llm_new_token(generation_chunk.text, chunk=generation_chunk)
            yield generation_chunk
