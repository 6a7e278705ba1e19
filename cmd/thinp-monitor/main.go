/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

// Command thinp-monitor keeps the thin-provisioned qcow2 disks of one
// libvirt domain ahead of the guest's writes, growing the loop devices
// under them: a demonstration and test driver of package thinp.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"libvirt.org/go/libvirt"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp/libvirtdomain"
)

func main() {
	uri := flag.String("uri", "", "libvirt connection URI (default: LIBVIRT_DEFAULT_URI)")
	domain := flag.String("domain", "", "domain to monitor")
	disks := flag.String("disks", "", "comma-separated target=loopdevice pairs, e.g. vda=/dev/loop3")
	chunk := flag.Int64("chunk", thinp.DefaultChunkSize, "bytes added per extension")
	threshold := flag.Int64("threshold", 0, "free bytes below which a disk is extended (default half a chunk)")
	poll := flag.Duration("poll", thinp.DefaultPollInterval, "period of the fallback poll")
	leavePaused := flag.Bool("leave-paused", false, "do not resume a domain paused for lack of space")
	metricsAddr := flag.String("metrics", "", "address to serve Prometheus metrics on, e.g. :9090")
	verbose := flag.Bool("v", false, "log every state change")
	flag.Parse()

	var logOpts logging.Options
	if *verbose {
		logOpts.Verbosity = 1
	}
	log, err := logging.New(logOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thinp-monitor:", err)
		os.Exit(1)
	}
	policy := thinp.Policy{ChunkSize: *chunk, FreeThreshold: *threshold, PollInterval: *poll}
	if *leavePaused {
		policy.Resume = thinp.LeavePaused
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx = logging.Setup(ctx, log)
	err = run(ctx, log, *uri, *domain, *disks, policy, *metricsAddr)
	stop()
	if err != nil {
		log.Error(err, "thinp-monitor failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, log logr.Logger, uri, domain, diskList string, policy thinp.Policy, metricsAddr string) error {
	if domain == "" || diskList == "" {
		return errors.New("-domain and -disks are required")
	}
	var disks []thinp.Disk
	for _, pair := range strings.Split(diskList, ",") {
		target, dev, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("disk %q is not target=device", pair)
		}
		ext, err := thinp.NewLoopExtender(dev)
		if err != nil {
			return err
		}
		maximum, err := thinp.MaximumSizeOf(ctx, qcow2.Tool{}, dev)
		if err != nil {
			return err
		}
		disks = append(disks, thinp.Disk{Target: target, Device: dev, Maximum: maximum, Extender: ext})
	}

	registry := prometheus.NewRegistry()
	metrics, err := thinp.NewMetrics(registry)
	if err != nil {
		return err
	}
	if metricsAddr != "" {
		srv := &http.Server{Addr: metricsAddr, Handler: promhttp.HandlerFor(registry, promhttp.HandlerOpts{})}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error(err, "metrics server")
			}
		}()
		defer srv.Close()
	}

	if err := libvirtdomain.StartEventLoop(); err != nil {
		return err
	}
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return fmt.Errorf("connect to libvirt: %w", err)
	}
	defer conn.Close()
	dom, err := libvirtdomain.New(conn, domain)
	if err != nil {
		return err
	}
	defer dom.Close()
	m, err := thinp.NewMonitor(thinp.Config{Domain: dom, Disks: disks, Policy: policy, Metrics: metrics, Logger: log})
	if err != nil {
		return err
	}
	return m.Run(ctx)
}
