//go:build tools

// Package tools pins the control-plane components built for the local test
// environment; `go build` of their main packages happens in build.sh.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3/ctlv3"
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubectl/pkg/cmd"
)
