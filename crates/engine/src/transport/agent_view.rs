//! [`AgentView`]: what a transport's target half uses of the agent that serves a peer. The target
//! halves (`tcp/target.rs`, `shm/target.rs`, `shm/ring_target.rs`, and the rdma and fabric
//! nodes' `accept`/`expose`) take this, not the agent: nothing below the façade imports the
//! agent, and the façade's connection handling (`server/`) hands it over once a peer is
//! authenticated.

use crate::config::AgentConfig;
use crate::error::Result;
use crate::limits::LimitHits;
use crate::notifications::Notification;
use crate::region::Registry;
use crate::target_stats::Served;

/// The agent as its served peers' transfers see it.
pub(crate) trait AgentView: Send + Sync + 'static {
    /// The regions peers may reach (every op is checked and leased here).
    fn registry(&self) -> &Registry;
    /// Timeouts and limits.
    fn config(&self) -> &AgentConfig;
    /// Where a refusal for a limit is counted.
    fn hits(&self) -> &LimitHits;
    /// What each peer moved through this agent, per transport.
    fn served(&self) -> &Served;
    /// Queues a peer's notification for the application; waits for room at most half the I/O
    /// timeout, so that the sender (waiting up to its own I/O timeout for the reply) hears the
    /// refusal instead of declaring the connection lost.
    fn deliver(&self, n: Notification) -> Result<()>;
    /// Whether the agent is going away: its regions are being deregistered, so a refusal
    /// served now may be an artefact of the teardown, not an answer (the peer must see the
    /// connection lost instead).
    fn shutting_down(&self) -> bool;
}
