//! A dcgm-exporter stand-in for the GPU tests: a loopback HTTP server whose `/metrics` is the
//! text dcgm-exporter's own template writes (`# HELP` / `# TYPE` per field, then one line per
//! GPU with the labels `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`,
//! `DCGM_FI_DRIVER_VERSION`), with the values a test scripts per scrape.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The eight GPUs of the test bed's CUDA / NVML stand-ins (a DGX H100 board), in device order.
pub const DGX_H100: [&str; 8] = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
];

/// The UUID the stand-ins give device `i` at `pci` (`tests/gpu-standin/gpu_standin.h`).
pub fn standin_uuid(i: usize, pci: &str) -> String {
    let p: Vec<u32> = pci
        .split([':', '.'])
        .map(|x| u32::from_str_radix(x, 16).unwrap())
        .collect();
    format!(
        "GPU-5c1ab1e0-{:04x}-{:02x}{:02x}-{:02x}00-0000000000{:02x}",
        p[0], p[1], p[2], p[3], i
    )
}

/// One field of one GPU: (field, dcgm-exporter type, value).
pub type Field = (&'static str, &'static str, String);

/// What a scrape shows for one GPU.
pub struct GpuLines {
    pub index: usize,
    pub pci: String,
    /// Leave out the `pci_bus_id` label (older dcgm-exporters): the agent must map the UUID.
    pub no_pci_label: bool,
    pub fields: Vec<Field>,
}

/// The body of one scrape, grouped by field as dcgm-exporter writes it.
pub fn body(gpus: &[GpuLines]) -> String {
    let mut order: Vec<(&str, &str)> = Vec::new();
    for g in gpus {
        for (f, t, _) in &g.fields {
            if !order.iter().any(|(o, _)| o == f) {
                order.push((f, t));
            }
        }
    }
    let mut out = String::new();
    for (f, t) in order {
        out.push_str(&format!("# HELP {f} {f} of the test.\n# TYPE {f} {t}\n"));
        for g in gpus {
            for (_, _, v) in g.fields.iter().filter(|x| x.0 == f) {
                let uuid = standin_uuid(g.index, &g.pci);
                let pci = if g.no_pci_label {
                    String::new()
                } else {
                    // dcgm-exporter writes NVML's form: 8 domain digits, upper case.
                    format!(",pci_bus_id=\"0000{}\"", g.pci.to_uppercase())
                };
                out.push_str(&format!(
                    "{f}{{gpu=\"{i}\",UUID=\"{uuid}\"{pci},device=\"nvidia{i}\",\
                     modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"testbed\",\
                     DCGM_FI_DRIVER_VERSION=\"570.133.20\"}} {v}\n",
                    i = g.index
                ));
            }
        }
    }
    out
}

/// The server. Dropping it stops answering.
pub struct DcgmExporter {
    pub url: String,
    scrapes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl DcgmExporter {
    /// Serve `render(n)` for the n-th scrape (from 0).
    pub fn start(render: impl Fn(u64) -> String + Send + 'static) -> DcgmExporter {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", l.local_addr().unwrap());
        let scrapes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, s) = (Arc::clone(&scrapes), Arc::clone(&stop));
        std::thread::spawn(move || {
            for c in l.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut c) = c else { continue };
                let mut req = [0u8; 4096];
                let _ = c.read(&mut req);
                let k = n.fetch_add(1, Ordering::Relaxed);
                let b = render(k);
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{b}",
                    b.len()
                );
            }
        });
        DcgmExporter { url, scrapes, stop }
    }

    /// Scrapes answered so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(Ordering::Relaxed)
    }
}

impl Drop for DcgmExporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        if let Some(a) = self.url.strip_prefix("http://") {
            let _ = std::net::TcpStream::connect(a.trim_end_matches("/metrics"));
        }
    }
}
