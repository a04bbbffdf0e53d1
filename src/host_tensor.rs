//! Flat `f32` tensors to host slices and back, for the host kernels' ops, with no copy beyond the
//! one the backend makes.

use burn::tensor::{Tensor, TensorData, backend::Backend};

/// A tensor's values on the host.
pub(crate) enum HostValues {
    /// The backend's data, viewed as `f32`s.
    Read(TensorData),
    /// The rare buffer whose alignment does not allow that view: converted.
    Converted(Vec<f32>),
}

impl HostValues {
    /// Reads `t` (a copy only where the backend makes one: a tensor sharing its buffer).
    ///
    /// # Panics
    /// If `t` is not `f32`.
    pub(crate) fn read<B: Backend>(t: Tensor<B, 1>) -> Self {
        let data = t.into_data();
        if data.as_slice::<f32>().is_ok() {
            HostValues::Read(data)
        } else {
            HostValues::Converted(owned(data))
        }
    }

    pub(crate) fn values(&self) -> &[f32] {
        match self {
            HostValues::Read(data) => data.as_slice().expect("checked when read"),
            HostValues::Converted(values) => values,
        }
    }
}

/// [`HostValues::read`] of each tensor.
pub(crate) fn read_all<B: Backend>(
    tensors: impl IntoIterator<Item = Tensor<B, 1>>,
) -> Vec<HostValues> {
    tensors.into_iter().map(HostValues::read).collect()
}

/// The values as a vector, to be changed in place (without a copy where the data's buffer
/// allows it).
///
/// # Panics
/// If the data is not `f32`.
pub(crate) fn owned(data: TensorData) -> Vec<f32> {
    data.into_vec::<f32>()
        .expect("the host kernels run on f32 tensors only")
}

/// A flat tensor of `values` (no copy).
pub(crate) fn tensor<B: Backend>(values: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}
