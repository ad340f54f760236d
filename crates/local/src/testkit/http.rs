//! A small HTTP/1.1 client for tests and benchmarks: one request per connection
//! (`Connection: close`), the whole answer read (chunked or not), to probe servers such as the
//! runtime, the controller's health endpoint or the sim's metrics.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;

use crate::error::{Error, Result};

/// An answer.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Null` when it is not JSON, so that assertions show the mismatch).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// `GET url`.
pub async fn get(url: &str) -> Result<Response> {
    request(Method::GET, url, None).await
}

/// `POST url` with a JSON body.
pub async fn post_json(url: &str, body: &serde_json::Value) -> Result<Response> {
    request(Method::POST, url, Some(body.to_string().into())).await
}

/// `method url` with an optional JSON `body`, over a fresh connection to the URL's
/// `host:port` (`http://` only).
pub async fn request(method: Method, url: &str, body: Option<Bytes>) -> Result<Response> {
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| Error::Http {
        method: method.to_string(),
        url: url.to_owned(),
        source,
    };
    let uri: http::Uri = url.parse().map_err(|e| failed(Box::new(e)))?;
    let authority = uri
        .authority()
        .ok_or_else(|| failed("the URL names no host".into()))?
        .to_string();
    let stream = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| failed(Box::new(e)))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(Box::new(e)))?;
    let driver = tokio::spawn(connection);
    let mut builder = Request::builder()
        .method(method.clone())
        .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(header::HOST, &authority)
        .header(header::CONNECTION, "close");
    if body.is_some() {
        builder = builder.header(header::CONTENT_TYPE, "application/json");
    }
    let request = builder
        .body(Full::new(body.unwrap_or_default()))
        .map_err(|e| failed(Box::new(e)))?;
    let answer = async {
        let response = sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok::<_, hyper::Error>(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
    .await;
    driver.abort();
    answer.map_err(|e| failed(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A chunked answer is read whole, and the request carries the method, path and body.
    #[tokio::test]
    async fn reads_a_chunked_answer_and_sends_the_body() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buffer = [0_u8; 1024];
            while !String::from_utf8_lossy(&seen).contains("{\"a\":1}") {
                let n = stream.read(&mut buffer).await.unwrap();
                seen.extend_from_slice(&buffer[..n]);
            }
            stream
                .write_all(
                    b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                )
                .await
                .unwrap();
            String::from_utf8_lossy(&seen).into_owned()
        });
        let answer = post_json(
            &format!("http://{addr}/v1/x?y=1"),
            &serde_json::json!({"a": 1}),
        )
        .await
        .unwrap();
        assert_eq!(answer.status, StatusCode::CREATED);
        assert_eq!(answer.text(), "abcde");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("POST /v1/x?y=1 HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("content-type: application/json"),
            "{request}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_request() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/healthz", closed.local_addr().unwrap());
        drop(closed);
        let error = get(&url).await.unwrap_err().to_string();
        assert!(error.starts_with(&format!("GET {url} failed")), "{error}");
    }
}
