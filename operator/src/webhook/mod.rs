pub mod certs;
pub mod tls;
