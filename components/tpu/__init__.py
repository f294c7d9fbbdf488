"""TPU hardware as data: the catalogue of accelerator families and slice topologies (``catalogue``), the list
prices the plan's cost comes from (``pricing``) and the static shapes a TPU program is compiled for (``shapes``).
Imports nothing else of the project; the GKE node pools, RayCluster worker groups and Ray ``ScalingConfig`` are all
derived from it in ``components.workload``."""
