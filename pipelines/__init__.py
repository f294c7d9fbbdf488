"""The tpupipe KFP pipeline and the `tpupipe` command line."""
