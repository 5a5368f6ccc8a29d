use veil_core::{approx::Approx, share, FixedPoint, Prg, RingTensor};
use veil_net::{run_two_party_tcp, Channel, Role, TcpChannel};
use veil_nonlinear::{functions, Ctx, OtSession, TruncMode};

fn main() -> veil_core::Result<()> {
    let fp = FixedPoint::default_format();
    let ring = fp.ring;
    let rows = 1536usize;
    let mut prg = Prg::from_os_entropy();
    // row sums in [1, 2^20)
    let vals: Vec<u64> = (0..rows).map(|_| 8 + (prg.u64() % (1 << 20))).collect();
    let x = RingTensor::from_vec(ring, &[rows], vals)?;
    let (x0, x1) = share(&x, &mut prg)?;
    let ax = Approx::new(fp)?;
    let party = |ch: &mut TcpChannel, role: Role, xs: &RingTensor| -> veil_core::Result<()> {
        let mut ot = OtSession::setup(ch, role)?;
        ot.precompute(ch, 1 << 22)?;
        ch.meter().reset();
        let mut cx = Ctx::new(&mut ot, ch, role, ax);
        cx.trunc_mode = TruncMode::OneBitError;
        let _y = functions::recip_at(&mut cx, xs.data(), ax.wide_recip_frac())?;
        ch.flush()?;
        if role == Role::Client {
            let t = ch.meter().total();
            println!(
                "recip total bits/row {:.0}",
                (t.bytes_sent + t.bytes_received) as f64 * 8.0 / rows as f64
            );
            for (k, v) in ch.meter().snapshot() {
                println!(
                    "  {k}: {:.0} bits/row",
                    (v.bytes_sent + v.bytes_received) as f64 * 8.0 / rows as f64
                );
            }
        }
        Ok(())
    };
    run_two_party_tcp(
        |ch| party(ch, Role::Client, &x0),
        |ch| party(ch, Role::Server, &x1),
    )?;
    Ok(())
}
