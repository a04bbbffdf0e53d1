//! Data parallelism: a batch's gradient computed in shards, one per device, at once on the threads
//! of rayon's pool, and summed on the main device.
//!
//! Several devices may be one device named several times: on a CPU backend, `N` copies of its
//! device are `N` workers sharing the CPU. That pays because Flex runs its matrix products
//! on every core but its elementwise kernels (exp, sigmoid, erf, the additions and products of
//! autodiff) on the calling thread only; two workers keep two cores busy through them
//! (results/performance.md, "Data-parallel workers on the CPU").

use super::LossKind;
use super::eval::batch_loss;
use crate::data::TokenBatch;
use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use coupled_qk::model::{FusedOps, Gpt};
use std::sync::Mutex;

/// A shard's loss value and gradients, or its non-finite loss value.
type ShardResult = Result<(f64, GradientsParams), f64>;

/// Forward and backward of one micro-batch over `devices`, its loss computed as `loss` says (see
/// [`batch_loss`]): the micro-batch's mean token loss and
/// the gradient of `loss / grad_accum` (what the training loop accumulates), on the main device
/// `devices[0]`. `Err` holds a non-finite loss (of a shard, with several devices), whose backward
/// is skipped.
///
/// With one device this is the plain step (no thread, no fork, no copy of the batch). With
/// several, the rows are split into one equal shard per device (`batch.rows` must be divisible by
/// `devices.len()`) and go through [`sharded_gradients`], each shard's mean loss divided by
/// `devices.len() · grad_accum`: the one-device gradient of the whole micro-batch up to float
/// rounding. The loss returned is the mean of the shards' mean losses.
///
/// # Panics
/// If `devices` is empty or does not divide `batch.rows`; a worker's panic is passed on.
pub fn batch_gradients<B: FusedOps>(
    model: &Gpt<B>,
    batch: &TokenBatch,
    devices: &[B::Device],
    grad_accum: usize,
    loss: LossKind,
) -> Result<(f64, GradientsParams), f64> {
    let n = devices.len();
    assert!(n > 0, "no device to compute the gradient on");
    let loss = |m: &Gpt<B>, b: &TokenBatch, d: &B::Device| batch_loss(m, b, d, loss);
    if n == 1 {
        let shards = std::slice::from_ref(batch);
        return sharded_gradients(model, shards, devices, grad_accum as f64, loss);
    }
    assert_eq!(
        batch.rows % n,
        0,
        "{} rows do not split over {n} devices",
        batch.rows
    );
    // Each shard's loss is the mean over its rows·seq_len tokens, 1/n of the micro-batch's:
    // dividing by n·grad_accum makes the shards' gradients sum to the one-device gradient.
    let (value, grads) = sharded_gradients(
        model,
        &split_rows(batch, n),
        devices,
        (n * grad_accum) as f64,
        loss,
    )?;
    Ok((value / n as f64, grads))
}

/// The gradient of `Σ_k loss(module, shards[k], devices[k]) / divisor` on `devices[0]`, and the
/// sum of the shards' loss values (before the division). `Err` holds a non-finite loss value,
/// whose backward is skipped.
///
/// The shards run on the threads of rayon's global pool, shard `k` on thread `k mod T` (`T`
/// threads), each with its own clone of `module` forked to its device (the same parameter ids,
/// its own autodiff graph); with more devices than threads a thread runs its shards one after
/// another. Pool threads live as long as the process, so their allocator caches do too: a
/// thread spawned per micro-batch made the allocator fault fresh pages in at every step (11% of a
/// profile of the torch-small step; the pool was faster in each of three interleaved runs,
/// results/performance.md). The shards' gradients are moved to `devices[0]` and summed there in
/// device order, so the result does not depend on which shard finishes first. A device may
/// appear more than once (workers sharing one device). The kernels inside a shard may use the
/// pool too (Flex's matrix products do). Call it from a thread outside rayon's pool, as the
/// training loops do: inside a pool task, the caller's thread would run a shard nested in it.
///
/// # Panics
/// If `shards` and `devices` differ in length or are empty; a worker's panic is passed on.
pub fn sharded_gradients<B, M, S>(
    module: &M,
    shards: &[S],
    devices: &[B::Device],
    divisor: f64,
    loss: impl Fn(&M, &S, &B::Device) -> Tensor<B, 1> + Sync,
) -> Result<(f64, GradientsParams), f64>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Send,
    S: Sync,
{
    assert!(
        !devices.is_empty() && shards.len() == devices.len(),
        "{} shards for {} devices: give one shard per device",
        shards.len(),
        devices.len()
    );
    let main = &devices[0];
    let one = |module: &M, shard: &S, device: &B::Device| {
        let loss = loss(module, shard, device);
        let value = loss.clone().into_scalar().elem::<f64>();
        if !value.is_finite() {
            return Err(value);
        }
        Ok((
            value,
            GradientsParams::from_grads((loss / divisor).backward(), module),
        ))
    };
    if devices.len() == 1 {
        return one(module, &shards[0], main);
    }
    // Burn creates weights lazily, and a clone of a not-yet-created weight draws its own: reading
    // every weight once (`num_params` does) makes the forks copies of this module.
    let _ = module.num_params();
    // One broadcast job per pool thread; thread `t` of `T` takes shards t, t + T, …. A broadcast
    // job runs only on its own thread and is never stolen, so a thread waiting inside one shard's
    // kernels cannot start another shard nested on its stack: that would deadlock on Burn's
    // autodiff graph locks (a backward pass holds its graph's lock, and its end locks the others).
    let forks: Vec<Mutex<Option<M>>> = devices
        .iter()
        .map(|_| Mutex::new(Some(module.clone())))
        .collect();
    let slots: Vec<Mutex<Option<ShardResult>>> = devices.iter().map(|_| Mutex::new(None)).collect();
    rayon::broadcast(|context| {
        for k in (context.index()..devices.len()).step_by(context.num_threads()) {
            let fork = forks[k]
                .lock()
                .unwrap()
                .take()
                .expect("each shard runs once");
            let result = one(&fork.fork(&devices[k]), &shards[k], &devices[k]);
            *slots[k].lock().unwrap() = Some(result);
        }
    });
    let results: Vec<ShardResult> = slots
        .into_iter()
        .map(|slot| slot.into_inner().unwrap().expect("every shard ran"))
        .collect();
    let mut sum = GradientsAccumulator::<M>::new();
    let mut values = 0.0;
    for (k, result) in results.into_iter().enumerate() {
        let (value, grads) = result?;
        values += value;
        let grads = if k == 0 {
            grads
        } else {
            grads.to_device::<B, M>(main, module)
        };
        sum.accumulate(module, grads);
    }
    Ok((values, sum.grads()))
}

/// `batch`'s rows in `parts` consecutive equal shards (`rows` divisible by `parts`).
fn split_rows(batch: &TokenBatch, parts: usize) -> Vec<TokenBatch> {
    (0..parts).map(|k| share_of_rows(batch, k, parts)).collect()
}

/// Share `part` of `parts` consecutive equal shares of `batch`'s rows (`rows` divisible by
/// `parts`): what one device, or one rank, computes. Its `target_bytes` is 0: the training loss
/// does not use it.
pub fn share_of_rows(batch: &TokenBatch, part: usize, parts: usize) -> TokenBatch {
    let rows = batch.rows / parts;
    let len = rows * batch.seq_len;
    TokenBatch {
        inputs: batch.inputs[part * len..(part + 1) * len].to_vec(),
        targets: batch.targets[part * len..(part + 1) * len].to_vec(),
        rows,
        seq_len: batch.seq_len,
        target_bytes: 0,
    }
}
