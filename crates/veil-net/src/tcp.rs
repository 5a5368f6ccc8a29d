//! TCP transport: TCP_NODELAY (protocol messages are latency-bound), 1 MiB buffers.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use veil_core::{Error, Result};

use crate::{Channel, Meter};

const BUF_BYTES: usize = 1 << 20;

pub struct TcpChannel {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    meter: Meter,
}

impl TcpChannel {
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Self> {
        Self::from_stream(TcpStream::connect(addr)?)
    }

    pub fn from_stream(stream: TcpStream) -> Result<Self> {
        stream.set_nodelay(true)?;
        let reader = BufReader::with_capacity(BUF_BYTES, stream.try_clone()?);
        let writer = BufWriter::with_capacity(BUF_BYTES, stream);
        Ok(TcpChannel {
            reader,
            writer,
            meter: Meter::new(),
        })
    }

    /// A peer silent for longer than `t` makes receives fail instead of hanging forever.
    pub fn set_timeout(&mut self, t: Option<Duration>) -> Result<()> {
        self.reader.get_ref().set_read_timeout(t)?;
        self.writer.get_ref().set_write_timeout(t)?;
        Ok(())
    }

    pub fn peer_addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.writer.get_ref().peer_addr()?)
    }
}

impl Channel for TcpChannel {
    fn send(&mut self, data: &[u8]) -> Result<()> {
        self.meter.on_send(data.len());
        self.writer.write_all(data).map_err(Error::from)
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        self.writer.flush()?;
        self.reader.read_exact(buf)?;
        self.meter.on_recv(buf.len());
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.writer.flush().map_err(Error::from)
    }

    fn meter(&self) -> &Meter {
        &self.meter
    }
}
