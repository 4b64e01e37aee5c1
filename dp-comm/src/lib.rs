//! Collectives for data-parallel training.
//!
//! This crate will hold all-reduce, broadcast, all-gather and reduce-scatter behind one
//! `Communicator` trait, with a threads-in-one-process backend for CPUs and NCCL for CUDA GPUs.
//! Its API is not written yet; the crate exists so the workspace layout is fixed from the start.
