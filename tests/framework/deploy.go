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

package framework

import (
	"context"
	"path/filepath"

	"github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// FieldManager owns what the suites apply.
const FieldManager = "kubevirt-qcow2"

// Render builds a kustomization under deploy/ (or at an absolute path, a
// user's overlay) in-process, as `kubectl apply -k` would (the kustomize
// kubectl 1.33 embeds).
func Render(kustomization string) []*unstructured.Unstructured {
	dir := kustomization
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(testenv.RepoRoot(), "deploy", kustomization)
	}
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	gomega.Expect(err).ToNot(gomega.HaveOccurred(), "kustomize build %s", dir)
	var objs []*unstructured.Unstructured
	for _, res := range resMap.Resources() {
		// Through JSON: kustomize's maps hold Go ints, which unstructured
		// objects do not.
		data, err := res.MarshalJSON()
		gomega.Expect(err).ToNot(gomega.HaveOccurred())
		obj := &unstructured.Unstructured{}
		gomega.Expect(obj.UnmarshalJSON(data)).To(gomega.Succeed())
		objs = append(objs, obj)
	}
	return objs
}

// ApplyServerSide is `kubectl apply --server-side --field-manager=...
// --force-conflicts` of each object.
func ApplyServerSide(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, opts ...client.PatchOption) {
	for _, o := range objs {
		gomega.Expect(c.Patch(ctx, o.DeepCopy(), client.Apply, append(opts, client.FieldOwner(FieldManager), client.ForceOwnership)...)).
			To(gomega.Succeed(), "apply %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
	}
}

// Allowed asks the API server whether user may verb the resource in
// namespace ("" for all namespaces).
func Allowed(ctx context.Context, c client.Client, user, namespace, group, resource, verb string) bool {
	return AllowedOn(ctx, c, user, authorizationv1.ResourceAttributes{Namespace: namespace, Group: group, Resource: resource, Verb: verb})
}

// AllowedOn asks the API server whether user may do what attributes say
// (a named object's, too).
func AllowedOn(ctx context.Context, c client.Client, user string, attributes authorizationv1.ResourceAttributes) bool {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, ResourceAttributes: &attributes,
	}}
	gomega.Expect(c.Create(ctx, review)).To(gomega.Succeed(), "review %s %s", attributes.Verb, attributes.Resource)
	return review.Status.Allowed
}
