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

package csiloop

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Kubelet finds node plugins by the sockets in its plugins_registry
// directory: it calls GetInfo on each new one, registers a CSI plugin at
// the endpoint it names (calling the driver's NodeGetInfo there and
// recording the node's ID in its CSINode object), then tells the plugin
// the outcome with NotifyRegistrationStatus. Removing the socket
// unregisters the plugin. This is what node-driver-registrar does; the Go
// module proxy does not serve it, and the driver needs nothing more.

// SupportedCSIVersions are the CSI versions kubelet may speak to the
// driver in: kubelet takes the highest with major version 1.
var SupportedCSIVersions = []string{"1.0.0"}

// Registration serves kubelet's plugin registration API for a CSI driver.
type Registration struct {
	registerapi.UnimplementedRegistrationServer
	// Name is the driver's name.
	Name string
	// Endpoint is the driver's CSI socket as kubelet reaches it: a path
	// on the node.
	Endpoint string
	// Failed is called when kubelet reports the registration failed; nil
	// only logs it. node-driver-registrar exits then, so that the pod
	// restarts and registers again.
	Failed func(error)
	// Logger logs the calls; the zero value discards.
	Logger logr.Logger
}

// NewServer returns a gRPC server of the registration API.
func (r *Registration) NewServer() *grpc.Server {
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	return srv
}

// GetInfo names the plugin, its kind and its CSI endpoint.
func (r *Registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.Logger.Info("kubelet asks for the plugin's information", "name", r.Name, "endpoint", r.Endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.Name,
		Endpoint:          r.Endpoint,
		SupportedVersions: SupportedCSIVersions,
	}, nil
}

// NotifyRegistrationStatus hears whether kubelet registered the plugin.
func (r *Registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		r.Logger.Info("kubelet registered the plugin", "name", r.Name)
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	err := fmt.Errorf("kubelet did not register plugin %s: %s", r.Name, st.GetError())
	r.Logger.Error(err, "registration failed")
	if r.Failed != nil {
		r.Failed(err)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
