"""The compiled pipeline read as Vertex AI Pipelines will read it, offline: what ``tpupipe compile`` (so ``make
compile-pipeline``, what a user's CI runs) checks after compiling, and ``tpupipe check-pipeline FILE`` checks of any
file. Each problem names its field; none found, the file is what a run given only the defaults (the UI's run form
with nothing but a preset chosen) starts from.

- The spec parses as kfp's own ``PipelineSpec`` message (``kfp.pipeline_spec.pipeline_spec_pb2``): no unknown field,
  no unknown enum value.
- Every pipeline parameter has a type of ``ParameterType`` (the same message's enum), a default of that type (a run
  given only the preset is complete) and a description (the run form shows it beside the field).
- ``defaultPipelineRoot`` is a ``gs://`` path (the run form's Cloud Storage location).
- The SDK builds the job from it offline with the defaults (``aiplatform.PipelineJob``, as ``tpupipe submit`` and the
  SDK's users do): its job id from the pipeline's name, its runtime config from the parameters.
"""

from __future__ import annotations

from pathlib import Path

# ParameterType's values (kfp/pipeline_spec/pipeline_spec_pb2.py) and the JSON values a default of each may be.
TYPES = {
    "STRING": (str,),
    "NUMBER_INTEGER": (int,),
    "NUMBER_DOUBLE": (int, float),
    "BOOLEAN": (bool,),
    "LIST": (list,),
    "STRUCT": (dict,),
}


def problems(path: str, project: str, region: str) -> list[str]:
    """What Vertex AI would refuse, or what a run of the defaults would lack, in the compiled pipeline at ``path``."""
    import yaml
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = yaml.safe_load(Path(path).read_text())
    if not isinstance(spec, dict):
        return [f"{path}: not a compiled pipeline (a YAML mapping)"]
    found = []
    try:
        json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    except json_format.ParseError as exc:
        found.append(f"not a PipelineSpec: {exc}")
    parameters = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    for name, parameter in sorted(parameters.items()):
        kind = parameter.get("parameterType")
        if kind not in TYPES:
            found.append(f"parameter {name}: type {kind!r} is not a parameter type (valid: {', '.join(TYPES)})")
        elif "defaultValue" not in parameter:
            found.append(f"parameter {name}: no default: a run given only the preset would lack it")
        elif not isinstance(parameter["defaultValue"], TYPES[kind]) or (
            isinstance(parameter["defaultValue"], bool) and kind != "BOOLEAN"
        ):
            found.append(f"parameter {name}: default {parameter['defaultValue']!r} is not a {kind}")
        if not str(parameter.get("description", "")).strip():
            found.append(f"parameter {name}: no description (the Vertex AI run form shows it beside the field)")
    root = spec.get("defaultPipelineRoot", "")
    if not str(root).startswith("gs://"):
        found.append(f"defaultPipelineRoot: {root!r} is not a gs:// path (the run form's Cloud Storage location)")
    if found:
        return found
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    try:
        aiplatform.PipelineJob(
            display_name="check",
            template_path=path,
            project=project,
            location=region,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]  # google-auth's __init__: untyped
        )
    except (ValueError, TypeError, KeyError) as exc:
        found.append(f"the Vertex AI SDK refuses it: {exc}")
    return found


def check(path: str, project: str, region: str) -> None:
    """Raise a SpecError naming every problem of the compiled pipeline at ``path``."""
    from components.spec import SpecError

    found = problems(path, project, region)
    if found:
        raise SpecError(path, "Vertex AI would not run it as compiled: " + "; ".join(found))
