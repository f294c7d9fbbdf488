"""tpupipe's orchestration side: the run spec (``spec``), TPU hardware as data (``tpu``), what a run means on the
hardware (``workload``), the platforms that create its resources (``platforms``), the stages (``stages``) and the
thin KFP components over them (``definitions``). docs/architecture.md states the dependency rules between them."""
