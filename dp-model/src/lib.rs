//! A small autograd model layer for data-parallel training.
//!
//! This crate will hold a static tape of layer-level ops over flat parameter and gradient
//! buffers, layers, losses and optimizers on ndarray, and the memory techniques (pruning, int8
//! quantization, activation recomputation). Its API is not written yet; the crate exists so the
//! workspace layout is fixed from the start.
