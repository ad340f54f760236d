//! The agent-sandbox controller.
pub mod decide;
