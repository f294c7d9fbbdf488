"""tpupipe's stages: the run spec, the platforms, and the plain functions each KFP component calls."""
