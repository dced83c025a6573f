"""infercept's shipped configuration, installed as the package `infercept.configs`: the default server
config (`default.yaml`), the paper's Table-1 augmentation priors (`augmentations.yaml`) and the measured
performance profiles (`profiles/*.json`). Read them through `engine_adapter.paths`, never by a path
relative to a source file."""
