//! The data management unit: objects made of blocks reached through
//! checksummed block pointers, written copy-on-write in transaction groups.

pub mod blkptr;
pub mod bufpool;
pub mod changelog;
pub mod checksum;
pub mod compress;
pub mod dirty_block;
pub mod dnode;
pub mod early_write;
pub mod objset;
pub mod partial;
pub mod traverse;
pub mod tx;
pub mod zap;
