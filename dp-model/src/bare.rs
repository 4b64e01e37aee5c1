//! A model's products and convolution layers run alone, on operands of their shapes, so a
//! benchmark can set a step's time against the time of its parts (the `bench` feature).

use dp_mem::{Pool, Tracker};

use crate::float::Float;
use crate::model::Model;
use crate::ops::Op;
use crate::ops::conv::Conv2d;
use crate::ops::gemm::{Gemm, GemmBackend, GemmShape, Precision};
use crate::ops::workspace::{ScratchLens, Workspace};

/// Operands laid out as a [`GemmShape`] says, to run it bare.
#[derive(Debug)]
pub struct BareGemm<T> {
    shape: GemmShape,
    a: ndarray::Array2<T>,
    b: ndarray::Array2<T>,
    c: ndarray::Array2<T>,
    gemm: Gemm,
}

impl<T: Float> BareGemm<T> {
    /// Operands filled with small values, multiplied as the model's step does.
    pub fn new(shape: GemmShape) -> Self {
        Self::on(shape, GemmBackend::current(), Precision::F32).expect("the current backend runs")
    }

    /// Operands multiplied on `backend` in `precision`, to compare them in one run; `None`
    /// when this CPU runs either not.
    pub fn on(shape: GemmShape, backend: GemmBackend, precision: Precision) -> Option<Self> {
        if !backend.available() || !precision.available() {
            return None;
        }
        let fill = |rows, cols| {
            ndarray::Array2::from_shape_fn((rows, cols), |(i, j)| {
                T::of(((i * 7 + j * 3) % 11) as f64 / 11.0)
            })
        };
        let a = if shape.a_transposed { fill(shape.k, shape.m) } else { fill(shape.m, shape.k) };
        let b = if shape.b_transposed { fill(shape.n, shape.k) } else { fill(shape.k, shape.n) };
        let pool = Pool::new(&Tracker::new());
        let gemm = Gemm::new(&pool, backend, precision).ok()?;
        Some(Self { shape, a, b, c: ndarray::Array2::zeros((shape.m, shape.n)), gemm })
    }

    /// The product's shape.
    pub fn shape(&self) -> GemmShape {
        self.shape
    }

    /// Runs the product once.
    pub fn run(&mut self) {
        let a = if self.shape.a_transposed { self.a.t() } else { self.a.view() };
        let b = if self.shape.b_transposed { self.b.t() } else { self.b.view() };
        self.gemm.matmul(a, b, T::zero(), &mut self.c.view_mut());
    }
}

/// One convolution layer of a model run alone, forward then backward (the input gradient
/// too, unless it is the model's first layer), on operands of the layer's shapes, so a
/// benchmark can set its time against the time of its products run bare ([`BareConv::gemm_shapes`]).
#[derive(Debug)]
pub struct BareConv<T: Float> {
    conv: Conv2d,
    batch: usize,
    first: bool,
    params: Vec<T>,
    grads: Vec<T>,
    x: Vec<T>,
    y: Vec<T>,
    dx: Vec<T>,
    work: Workspace<T>,
}

impl<T: Float> BareConv<T> {
    fn new(conv: &Conv2d, batch: usize, first: bool, precision: Precision) -> Self {
        let conv = Conv2d { offset: 0, ..conv.clone() };
        let fill = |len: usize, seed: usize| -> Vec<T> {
            (0..len).map(|i| T::of(((i * 7 + seed) % 11) as f64 / 11.0 - 0.5)).collect()
        };
        let input = conv.channels * batch * conv.height * conv.width;
        let output = conv.out_channels * batch * conv.out_height * conv.out_width;
        let pool = Pool::new(&Tracker::new());
        let work = Workspace::new(
            &pool,
            ScratchLens { cols: conv.scratch_len(batch), norm: 0, attention: 0 },
            precision,
        )
        .expect("an unlimited pool");
        Self {
            params: fill(conv.param_len(), 1),
            grads: vec![T::zero(); conv.param_len()],
            x: fill(input, 2),
            y: fill(output, 3),
            dx: vec![T::zero(); if first { 0 } else { input }],
            conv,
            batch,
            first,
            work,
        }
    }

    /// The products one [`BareConv::run`] multiplies, as [`crate::Model::gemm_shapes`] lists
    /// them.
    pub fn gemm_shapes(&self) -> Vec<GemmShape> {
        let c = &self.conv;
        let (n, patch, oc) =
            (self.batch * c.out_height * c.out_width, c.patch_len(), c.out_channels);
        let g =
            |m, k, n, a_transposed, b_transposed| GemmShape { m, k, n, a_transposed, b_transposed };
        let mut shapes = vec![g(oc, patch, n, false, false), g(oc, n, patch, false, true)];
        if !self.first {
            shapes.push(g(patch, oc, n, true, false));
        }
        shapes
    }

    /// Runs the layer's forward and backward once; its output stands in for the gradient
    /// coming back.
    pub fn run(&mut self) {
        let c = &self.conv;
        let work = &mut self.work;
        c.forward(self.batch, &self.params, &self.x, &mut self.y, &mut work.cols, &mut work.gemm);
        let dx = (!self.first).then_some(&mut self.dx[..]);
        let (params, grads, x, dy) = (&self.params, &mut self.grads, &self.x, &self.y);
        c.backward(
            self.batch,
            params,
            grads,
            x,
            dy,
            dx,
            false,
            &mut work.cols,
            false,
            &mut work.gemm,
        );
    }
}

impl<T: Float> Model<T> {
    /// Each convolution layer of the model, to run alone on `batch` samples ([`BareConv`]),
    /// its products in the model's precision.
    pub fn bare_convs(&self, batch: usize) -> Vec<BareConv<T>> {
        let precision = self.options().precision;
        let conv = |(i, op): (usize, &Op)| match op {
            Op::Conv2d(c) => Some(BareConv::new(c, batch, i == 0, precision)),
            _ => None,
        };
        self.ops().enumerate().filter_map(conv).collect()
    }
}
