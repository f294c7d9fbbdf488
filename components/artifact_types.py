"""The KFP artifact types of the components' signatures beyond kfp's own. A component naming one is compiled with
``from components.artifact_types import <type>`` in its command (kfp writes the import of a custom artifact type:
kfp/dsl/types/custom_artifact_types.py), so the task imports this module, where kfp's executor loads only the runtime
part of ``kfp.dsl`` (no ``dsl.component``): it imports nothing but ``kfp.dsl``'s artifact base.
"""

from kfp import dsl


class VertexModel(dsl.Artifact):  # type: ignore[misc]  # kfp ships no type information: dsl.Artifact is Any here
    """A version in Vertex AI Model Registry, as the Vertex AI UI links a run to it: the artifact type of that schema
    title that google-cloud-pipeline-components defines (``google_cloud_pipeline_components.types.artifact_types``:
    schema ``google.VertexModel`` 0.0.1, one metadata property, ``resourceName``; its uri the model's REST URL),
    defined here rather than imported from that package (docs/vertex.md, "Lineage"). KFP imports it in the task
    (this module), which the components image can: it has this package."""

    schema_title = "google.VertexModel"
    schema_version = "0.0.1"
