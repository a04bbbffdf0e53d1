//! How a module generic over `Backend` finds the host kernel op of the backend it runs on: a
//! table from the backend's `TypeId` to a function of that backend, filled for Flex and NdArray
//! (those of the crate's features), each plain and under `Autodiff` with either checkpointing
//! strategy.

use std::any::{Any, TypeId};
use std::collections::HashMap;

/// Functions of backends, keyed by the backend's `TypeId`.
#[derive(Default)]
pub(crate) struct OpTable(HashMap<TypeId, Box<dyn Any + Send + Sync>>);

impl OpTable {
    /// Adds `f` as the op of backend `B`.
    pub(crate) fn insert<B: 'static, F: Any + Send + Sync>(&mut self, f: F) {
        self.0.insert(TypeId::of::<B>(), Box::new(f));
    }

    /// The op of backend `B`, if it has one.
    pub(crate) fn get<B: 'static, F: Any + Copy>(&self) -> Option<F> {
        self.0
            .get(&TypeId::of::<B>())
            .and_then(|f| f.downcast_ref::<F>())
            .copied()
    }
}

/// Fills `$table` for every host backend the crate's features name: `$plain::<B>` for `B`, and
/// `$tracked::<B, C>` for `Autodiff<B, C>`, each of type `$fn_type<backend>` (the two functions
/// in scope by name).
macro_rules! register_host_ops {
    ($table:expr, $fn_type:ident, $plain:ident, $tracked:ident) => {{
        #[allow(unused_macros)]
        macro_rules! one {
            ($backend:ty) => {{
                use burn::backend::Autodiff;
                use burn::backend::autodiff::checkpoint::strategy::{
                    BalancedCheckpointing, NoCheckpointing,
                };
                let plain: $fn_type<$backend> = $plain::<$backend>;
                $table.insert::<$backend, _>(plain);
                let tracked: $fn_type<Autodiff<$backend>> = $tracked::<$backend, NoCheckpointing>;
                $table.insert::<Autodiff<$backend>, _>(tracked);
                let balanced: $fn_type<Autodiff<$backend, BalancedCheckpointing>> =
                    $tracked::<$backend, BalancedCheckpointing>;
                $table.insert::<Autodiff<$backend, BalancedCheckpointing>, _>(balanced);
            }};
        }
        #[cfg(feature = "flex")]
        one!(burn::backend::Flex);
        #[cfg(feature = "ndarray")]
        one!(burn::backend::NdArray);
    }};
}
pub(crate) use register_host_ops;
