//! Additive secret sharing over Z_{2^ℓ}: x = x0 + x1 with x0 uniform, so either share alone is
//! independent of x (perfect hiding).

use crate::{Prg, Result, RingTensor};

/// Splits `x` into (x0, x1) with x0 uniform from `prg` and x1 = x − x0.
pub fn share(x: &RingTensor, prg: &mut Prg) -> Result<(RingTensor, RingTensor)> {
    let x0 = RingTensor::random(x.ring(), x.shape(), prg)?;
    let x1 = x.sub(&x0)?;
    Ok((x0, x1))
}

/// x0 + x1.
pub fn reconstruct(x0: &RingTensor, x1: &RingTensor) -> Result<RingTensor> {
    x0.add(x1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FixedPoint, Ring};

    #[test]
    fn share_reconstruct_round_trip() {
        let fp = FixedPoint::default_format();
        let x = RingTensor::encode(fp, &[3], &[1.5, -2.25, 0.0]).unwrap();
        let mut prg = Prg::from_os_entropy();
        let (a, b) = share(&x, &mut prg).unwrap();
        assert_ne!(a, x);
        assert_eq!(reconstruct(&a, &b).unwrap(), x);
        assert_eq!(
            reconstruct(&a, &b).unwrap().decode(fp),
            vec![1.5, -2.25, 0.0]
        );
        let _ = Ring::new(41).unwrap();
    }
}
