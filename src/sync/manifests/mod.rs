//! Manifests: loading and validating the files of a commit.
