//! The process kubelet (issue: a real control plane in the test loop). So far: the kubelet API's
//! streaming protocols — [`spdy`] sessions and [`portforward`] over them, as the API server
//! speaks them to a kubelet for `kubectl port-forward`.

pub mod portforward;
pub mod spdy;
