//! What the guest is given to see, built on the host before it boots: the
//! root layout's shares (`root`), the account and host files that give it an
//! identity (`identity`), the user's home toolchains (`home_tools`), each
//! agent's own state directory (`agent_state`) and the scratch disk holding
//! the workspace overlay's upper layer (`scratch`).

pub(super) mod agent_state;
pub(super) mod home_tools;
pub(super) mod identity;
pub(super) mod root;
pub mod scratch;
