//! `capstan crds`: the CRDs of every kind capstan handles, as one YAML stream.

/// Prints the CRDs to stdout.
pub fn run() -> anyhow::Result<i32> {
    print!("{}", capstan_api::crds::to_yaml()?);
    Ok(0)
}
