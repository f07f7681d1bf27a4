"""The trained pieces a drafter ships (blockwise heads, a BiTA adapter, a NAT drafter) are small torch modules saved
as a folder: NAME.safetensors (fp16 tensors) + NAME.json (format tag, the config dataclass, training facts).
One reader and one writer for all of them, so each refuses a wrong or damaged folder the same clear way."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import DraftVerifyError

SavedT = TypeVar("SavedT", bound="SavedModule")


def save_fp16(module: nn.Module, path: Path, format: str) -> None:
    """The module's state as fp16 safetensors at `path`, its metadata's format `format` (half the bytes of f32;
    loading casts back to float32)."""
    tensors = {name: t.detach().to("cpu", torch.float16).contiguous() for name, t in module.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": format})


def read_json(path: Path) -> Any:
    """The JSON at `path`; DraftVerifyError naming the file when it is not JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DraftVerifyError(f"{path} is not valid JSON: {err}") from None


def fill(module: nn.Module, weights_path: Path) -> nn.Module:
    """`module` (freshly built from its config) with the tensors of `weights_path` as float32; DraftVerifyError
    when the file's names or shapes are not the module's (a damaged file, or a config that does not match it)."""
    tensors = load_file(str(weights_path))
    expected = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if found != expected:
        raise DraftVerifyError(f"{weights_path} does not match its config: tensors {found}, expected {expected}")
    module.load_state_dict({name: t.float() for name, t in tensors.items()})
    return module


@dataclass(frozen=True)
class WeightsFolder:
    stem: str  # heads -> heads.json + heads.safetensors
    format: str  # the tag written into both files
    what: str  # "blockwise heads", for messages
    made_by: str  # the command that writes such a folder, for messages

    def save(self, module: nn.Module, config, folder: str | Path, metadata: dict | None = None) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_fp16(module, folder / f"{self.stem}.safetensors", self.format)
        info = {"format": self.format, "version": 1, **asdict(config), **(metadata or {})}
        (folder / f"{self.stem}.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
        return folder

    def load(self, build, config_cls, folder: str | Path) -> nn.Module:
        """build(config) -> a fresh module of config_cls's shape, then filled (float32) from the folder."""
        folder = Path(folder)
        config_path, weights_path = folder / f"{self.stem}.json", folder / f"{self.stem}.safetensors"
        if not config_path.is_file() or not weights_path.is_file():
            raise DraftVerifyError(
                f"no {self.what} in {folder}: expected {config_path.name} and {weights_path.name} "
                f"(written by `{self.made_by}`)"
            )
        info = read_json(config_path)
        if not isinstance(info, dict) or info.get("format") != self.format:
            found = info.get("format") if isinstance(info, dict) else None
            raise DraftVerifyError(f"{config_path} is not a {self.what} config (format {found!r})")
        fields = config_cls.__dataclass_fields__
        # a field with a default may be absent: files written before the field existed
        missing = [name for name, f in fields.items() if name not in info and f.default is MISSING]
        if missing:
            raise DraftVerifyError(f"{config_path} lacks {', '.join(missing)}")
        return fill(build(config_cls(**{name: info[name] for name in fields if name in info})), weights_path)


class SavedModule(nn.Module):
    """A trained piece that lives in a WeightsFolder: a subclass names its `weights_folder` and `config_class`,
    holds its config dataclass as `config` and is built from it (`cls(config)`), so save and load are these."""

    weights_folder: ClassVar[WeightsFolder]
    config_class: ClassVar[type]

    def __init__(self, config: Any):
        super().__init__()
        self.config = config

    def save(self, folder: str | Path, metadata: dict | None = None) -> Path:
        """folder/STEM.safetensors (fp16) + folder/STEM.json (config and any metadata, e.g. training facts)."""
        return self.weights_folder.save(self, self.config, folder, metadata)

    @classmethod
    def load(cls: type[SavedT], folder: str | Path) -> SavedT:
        return cast(SavedT, cls.weights_folder.load(cls, cls.config_class, folder))
