"""The options of `rldojo serve` that shape what the model reads, checked before it serves,
as vLLM's flags of the same names:

- `--max-model-len N`: the context window the server allows (prompt + `max_tokens`);
  at most the model's own positions (`max_position_embeddings`, the default).
- `--chat-template T`: a Jinja chat template replacing the tokenizer's; `T` is a file, or
  the template itself when it is no file and holds Jinja (``{{``, ``{%``, ``{#`` or a
  line break). It must compile; one that fails only on some conversation (its
  ``raise_exception``) fails those requests, as a 400 naming `messages`.

A bad option is a `ServeOptionError`: one line naming the flag, before the port is
served (before the model loads, where the model is not needed to tell).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ServeOptionError",
    "check_max_model_len",
    "context_window",
    "load_chat_template",
]

_JINJA_MARKS = ("{{", "{%", "{#", "\n")
"""What only an inline template holds, never a file name."""


class ServeOptionError(ValueError):
    """An option of `rldojo serve` that cannot be served; the message is the one line the
    user reads, the flag first."""


def check_max_model_len(value: int) -> int:
    """`value` if it can be a context window at all."""
    if value < 1:
        raise ServeOptionError(f"--max-model-len: must be at least 1, got {value}")
    return value


def context_window(positions: int, max_model_len: int | None) -> int:
    """The tokens a sequence may hold (prompt + completion): `max_model_len`, which may not
    pass the model's `positions` (0: unknown), or else the model's own."""
    if max_model_len is None:
        return positions
    check_max_model_len(max_model_len)
    if positions and max_model_len > positions:
        raise ServeOptionError(
            f"--max-model-len: {max_model_len} is more than the model's {positions} "
            "positions (max_position_embeddings)"
        )
    return max_model_len


def load_chat_template(value: str) -> str:
    """The template text of `--chat-template`: a file's contents, or `value` itself when it
    holds Jinja; checked to compile."""
    path = Path(value).expanduser()
    looks_inline = any(mark in value for mark in _JINJA_MARKS)
    if not looks_inline or path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ServeOptionError(
                f"--chat-template: no file {value} (nor a template: it holds no {{{{ or {{%)"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ServeOptionError(f"--chat-template: cannot read {value}: {exc}") from None
        _check_compiles(text, f"{value}: ")
        return text
    _check_compiles(value, "")
    return value


def _check_compiles(template: str, where: str) -> None:
    """Compile `template` as transformers does (its filters and tags), rendering it once
    for a one-turn conversation; only a template that does not compile is refused."""
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        render_jinja_template(
            conversations=[[{"role": "user", "content": "hi"}]],
            chat_template=template,
            add_generation_prompt=True,
        )
    except jinja2.TemplateSyntaxError as exc:
        message = " ".join(str(exc.message or exc).split())
        raise ServeOptionError(f"--chat-template: {where}line {exc.lineno}: {message}") from None
    except Exception:  # compiled: what fails on this conversation fails its requests
        pass
