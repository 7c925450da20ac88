"""The versioned prompt suite shipped with the gate."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from sglfleet.pipeline.config import StrictModel, build_model, read_yaml


class Prompt(StrictModel):
    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    category: str
    prompt: str = Field(min_length=1)
    system: str | None = None
    max_tokens: int = Field(default=128, ge=1)

    def messages(self) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return [*msgs, {"role": "user", "content": self.prompt}]


class Suite(StrictModel):
    version: int = Field(ge=1)
    prompts: list[Prompt] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        ids = [p.id for p in self.prompts]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate prompt ids {dup}")
        return self

    def get(self, prompt_id: str) -> Prompt:
        for p in self.prompts:
            if p.id == prompt_id:
                return p
        raise KeyError(prompt_id)


def load_suite(path: str | Path) -> Suite:
    return build_model(Suite, read_yaml(path), str(path))
