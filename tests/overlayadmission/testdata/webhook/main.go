/*
 * This file is part of the KubeVirt project
 *
 * Licensed under the Apache License, Version 2.0 (the "License");
 * you may not use this file except in compliance with the License.
 * You may obtain a copy of the License at
 *
 *     http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS,
 * WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
 * See the License for the specific language governing permissions and
 * limitations under the License.
 *
 * Copyright The KubeVirt Authors.
 *
 */

// webhook serves virt-api's validating admission of VirtualMachineInstances
// and VirtualMachines, as the tree it is built in implements it, over TLS on
// the paths virt-api uses. The cluster configuration (feature gates) follows
// the KubeVirt CR through informers, as in virt-api. It is built inside a
// patched KubeVirt tree by the overlay admission suite, which installs it as
// a validating webhook of a test API server.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"

	"kubevirt.io/kubevirt/pkg/controller"
	netadmitter "kubevirt.io/kubevirt/pkg/network/admitter"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	validating_webhook "kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

type options struct {
	kubeconfig string
	namespace  string
	listen     string
	certFile   string
	keyFile    string
}

func main() {
	var opts options
	flag.StringVar(&opts.kubeconfig, "kubeconfig", "", "kubeconfig of the API server to watch the KubeVirt CR in")
	flag.StringVar(&opts.namespace, "namespace", "kubevirt", "namespace of the KubeVirt CR")
	flag.StringVar(&opts.listen, "listen", "127.0.0.1:8443", "address to serve the webhooks on")
	flag.StringVar(&opts.certFile, "tls-cert-file", "", "serving certificate")
	flag.StringVar(&opts.keyFile, "tls-key-file", "", "serving key")
	flag.Parse()

	if err := run(opts); err != nil {
		fmt.Fprintf(os.Stderr, "webhook: %v\n", err)
		os.Exit(1)
	}
}

func run(opts options) error {
	virtCli, err := kubecli.GetKubevirtClientFromFlags("", opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("client from %s: %w", opts.kubeconfig, err)
	}

	stop := make(chan struct{})
	defer close(stop)

	factory := controller.NewKubeInformerFactory(virtCli.RestClient(), virtCli, nil, opts.namespace)
	kubeVirtInformer := factory.KubeVirt()
	crdInformer := factory.CRD()
	informers := &webhooks.Informers{
		NamespaceInformer:  factory.Namespace(),
		DataSourceInformer: factory.DummyDataSource(),
	}
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	clusterConfig, err := virtconfig.NewClusterConfig(crdInformer, kubeVirtInformer, opts.namespace)
	if err != nil {
		return fmt.Errorf("cluster config: %w", err)
	}
	serviceAccounts := map[string]struct{}{}

	mux := http.NewServeMux()
	mux.HandleFunc(components.VMICreateValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating_webhook.ServeVMICreate(w, r, clusterConfig, virtCli, serviceAccounts,
			func(field *field.Path, vmiSpec *v1.VirtualMachineInstanceSpec, clusterCfg *virtconfig.ClusterConfig) []metav1.StatusCause {
				return netadmitter.Validate(field, vmiSpec, clusterCfg)
			},
		)
	})
	mux.HandleFunc(components.VMValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating_webhook.ServeVMs(w, r, clusterConfig, virtCli, informers, serviceAccounts)
	})

	listener, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return err
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		server.Close()
	}()

	if err := server.ServeTLS(listener, opts.certFile, opts.keyFile); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
