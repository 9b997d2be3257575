//! The upgrade layer: what the version-label, campaign and drain controllers share about a
//! node's ordered upgrade, and none of them owns. They depend on it; it depends on none of
//! them.
//!
//! - [`progress`]: a Module's upgrade on a node as its Node annotation keeps it
//!   ([`Progress`]), the wait it announced ([`PolicyWait`]), and the stamps of the commit
//!   that asked ([`Stamp`]).
//! - [`policy`]: which `GitSync` governs a node ([`Policies`]): its policy, whether it is
//!   writing a commit, and who asked for a move ([`policy::asked_by`]).
//! - [`gate`]: the campaigns a move may wait for ([`Campaigns`]).
//! - [`drain`]: a campaign's drain of a node ([`drain::DrainState`]): how it starts and
//!   ends in the version-label controller's write, and how its steps are recorded.
//!
//! ```text
//!   version_labels ──┐
//!   campaign ────────┼──> upgrade (progress, policy, gate, drain)
//!   drain ───────────┘
//! ```

pub mod drain;
pub mod gate;
pub mod guard;
pub mod policy;
pub mod progress;
pub mod window;

pub use gate::{CampaignGate, Campaigns, Hold};
pub use policy::Policies;
pub use progress::{PolicyWait, Progress, Stamp, stamp_of};
