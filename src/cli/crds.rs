//! `capstan crds`: the CRDs of every kind capstan handles, as one YAML stream.

/// Prints the CRDs to stdout.
pub fn run() -> anyhow::Result<i32> {
    print!("{}", capstan_api::crds::to_yaml()?);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::Cli;

    #[test]
    fn help_names_every_kind_whose_crd_is_printed() {
        let help = match Cli::try_parse_from(["capstan", "crds", "--help"]) {
            Err(err) if err.kind() == clap::error::ErrorKind::DisplayHelp => err.to_string(),
            other => panic!("crds --help: {other:?}"),
        };
        for crd in capstan_api::crds::all() {
            let kind = &crd.spec.names.kind;
            assert!(help.contains(kind.as_str()), "{kind}: {help}");
        }
    }
}
