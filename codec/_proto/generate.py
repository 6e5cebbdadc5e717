"""Regenerate `pulsar_api_pb2.py` and `pulsar_api_pb2.pyi` from `pulsar_api.proto`.

Run as `python -m magnetar.codec._proto.generate` (what `make proto` does). The protobuf compiler
comes from the `grpcio-tools` wheel, so nothing outside the test dependencies is needed.

Two fix-ups follow the compiler, both to the type stub only:

* Pulsar's `Schema.Type` has a value named `None`, which Python can hold as an enum value
  (`Schema.Type.Value("None")`) but not spell as an attribute, so the stub lines that declare it
  as one are dropped; without that the stub is not valid Python.
* `Schema.Type` also has a value named `KeyValue`, and the stub repeats enum values as attributes
  of the enclosing class, where that one hides the `KeyValue` message type the class's own fields
  refer to. Such class-level repeats (a name that is also a top-level message) are dropped; the
  value stays reachable as `Schema.Type.KeyValue`, which is also the runtime's spelling.
* The stub's constructors take bare `Mapping` for map-like arguments, which strict mypy reports
  in every module that imports it; a header comment turns that one check off for the stub.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "pulsar_api.proto"
OUTPUTS = ("pulsar_api_pb2.py", "pulsar_api_pb2.pyi")
_NONE_ATTRIBUTE = re.compile(r"^\s+None: .*\n", re.MULTILINE)
_TOP_LEVEL_CLASS = re.compile(r"^class (\w+)\(_message\.Message\)", re.MULTILINE)
_CLASS_LEVEL_ENUM_VALUE = re.compile(r"^    (\w+): \w+\.\w+\n", re.MULTILINE)
_STUB_HEADER = '# mypy: disable-error-code="type-arg"\n'


def generate(out_dir: Path) -> list[Path]:
    """Compile the schema into `out_dir` and return the generated files."""
    from grpc_tools import protoc  # a test dependency: imported only when regenerating

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{HERE}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + str(PROTO))
    stub = out_dir / "pulsar_api_pb2.pyi"
    text = _NONE_ATTRIBUTE.sub("", stub.read_text())
    messages = set(_TOP_LEVEL_CLASS.findall(text))
    text = _CLASS_LEVEL_ENUM_VALUE.sub(lambda m: "" if m.group(1) in messages else m.group(0), text)
    stub.write_text(_STUB_HEADER + text)
    return [out_dir / name for name in OUTPUTS]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(path)
