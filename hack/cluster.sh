#!/usr/bin/env bash
#
# This file is part of the kubevirt-qcow2 project
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Copyright The kubevirt-qcow2 Authors.
#

# A one-node Kubernetes on this machine, for the end-to-end tests and for
# trying the patched KubeVirt by hand (docs/testing.md):
#
#   hack/cluster.sh up        start it (again: harmless; after a killed run: cleans first)
#                             CLUSTER_NODES=2 (or more): worker nodes beside it
#   hack/cluster.sh down      stop it and remove every process, mount, cgroup, loop device and veth
#   hack/cluster.sh status    say whether it runs and where its kubeconfig and logs are
#   hack/cluster.sh kubevirt  install the patched KubeVirt (make images first) and wait for it
#   hack/cluster.sh kubevirt-stock  install stock KubeVirt instead (make images-stock first)
#   hack/cluster.sh kubectl ARGS...
#   hack/cluster.sh import ARCHIVE...   import docker archives into the node's containerd
#   hack/cluster.sh tag IMAGE NAME      name an image every node holds by another name too
#   hack/cluster.sh exec [--node NAME] CMD...
#                             run a command inside a node's namespaces (the first's by default)
#
# Clusters side by side (CI's e2e runs): each with its own CLUSTER_DIR,
# CLUSTER_NAME (its links' and cgroups' prefix on the host) and addresses
# (CLUSTER_NODE_IP, CLUSTER_HOST_IP).
#
# The node runs in namespaces of its own (PID, mount, network, UTS) with
# hack/nodeinit as PID 1. Inside, /run is a tmpfs, /var/lib an overlay whose
# upper directory is ours (but /var/lib/csi-loop, one directory of ours
# all nodes share as their storage), /var/log a directory of ours, and the
# sysctls kubelet writes are files of ours, so the host's kubelet,
# containerd and CNI directories, sysctls and iptables are never touched. A veth pair joins
# the node's network namespace to the host's; the host end is the node's
# default gateway and how the host reaches the API server. Worker nodes
# are the same without the control plane; each has an eth0 on a bridge in
# the first node's network namespace, which routes between the nodes' pod
# networks and masquerades what they send to the host: the host sees no
# new route and forwards nothing.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly CLUSTER_DIR=${CLUSTER_DIR:-${QCOW2_ROOT}/_out/cluster}
readonly FIRST_NODE=kubevirt-qcow2-node
# A link name is at most 15 characters: <name>-node<i>.
readonly CLUSTER_NAME=${CLUSTER_NAME:-kvq}
[[ ${CLUSTER_NAME} =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "CLUSTER_NAME=${CLUSTER_NAME}: 1 to 8 lower-case letters and digits"
readonly FIRST_NODE_IP=${CLUSTER_NODE_IP:-10.99.0.1}
readonly HOST_IP=${CLUSTER_HOST_IP:-10.99.0.254}
readonly HOST_VETH=${CLUSTER_NAME}-node0
# The nodes' bridge in the first node: it is .1, worker i is .(i+1).
readonly NODES_BRIDGE=kvq-nodes
readonly NODES_NET=10.99.1
# Node i's pods are in 10.244.i.0/24.
readonly CLUSTER_CIDR=10.244.0.0/16
readonly SERVICE_CIDR=10.96.0.0/16
readonly KUBERNETES_SERVICE_IP=10.96.0.1
readonly NODE_PACKAGES=${QCOW2_CACHE}/node
# containerd's client in a node, on Kubernetes' namespace of images.
readonly NODE_CTR=("${NODE_PACKAGES}/usr/bin/ctr" --address /run/containerd/containerd.sock -n k8s.io)
readonly ETCD=${QCOW2_CACHE}/etcd/usr/bin/etcd
readonly PKI=${CLUSTER_DIR}/pki
# The nodes' shared storage: every node's /var/lib/csi-loop, where the
# csi-loop driver keeps its volumes (deploy/csi-loop).
readonly SHARED_STORAGE=${CLUSTER_DIR}/csi-loop
readonly KUBECONFIG_FILE=${CLUSTER_DIR}/kubeconfig
readonly PAUSE_IMAGE=kubevirt-qcow2/pause:dev
# How long `up` waits for the API server and for the node to be Ready.
readonly UP_TIMEOUT=${CLUSTER_UP_TIMEOUT:-180}

# Prints the comment between the licence header and `set`.
usage() {
	sed -n '/^$/,/^set -euo/p; /^set -euo/q' "$0" | sed '1d; $d; s/^# \{0,1\}//'
	exit 2
}

# node_vars sets the names and places of node i (0 is the first): its own
# directory under the first's, which keeps the paths of the one-node days.
node_vars() {
	local i=$1
	NODE_INDEX=${i}
	if ((i == 0)); then
		NODE_NAME=${FIRST_NODE}
		NODE_DIR=${CLUSTER_DIR}
		NODE_IP=${FIRST_NODE_IP}
	else
		NODE_NAME=${FIRST_NODE}$((i + 1))
		NODE_DIR=${CLUSTER_DIR}/nodes/${NODE_NAME}
		NODE_IP=${NODES_NET}.$((i + 1))
	fi
	CGROUP_NAME=${CLUSTER_NAME}-${NODE_NAME}
	POD_CIDR=10.244.${i}.0/24
	ETC=${NODE_DIR}/etc
	LOGS=${NODE_DIR}/logs
	PIDFILE=${NODE_DIR}/node.pid
}

# The indexes of the nodes a cluster has had, running or not.
known_nodes() {
	local dir
	echo 0
	for dir in "${CLUSTER_DIR}"/nodes/"${FIRST_NODE}"*/; do
		[[ -d ${dir} ]] || continue
		dir=${dir%/}
		echo $((${dir##*/"${FIRST_NODE}"} - 1))
	done
}

# The indexes of the running nodes.
running_nodes() {
	local i
	for i in $(known_nodes); do
		node_vars "${i}"
		[[ -z $(node_pid) ]] || echo "${i}"
	done
	node_vars 0
}

kubernetes_bin() {
	local dir
	dir=$("${QCOW2_ROOT}/hack/kubernetes.sh")
	echo "${dir}"
}

# The host PID of the node's nodeinit, empty when it does not run.
node_pid() {
	local pid
	[[ -f ${PIDFILE} ]] || return 0
	pid=$(<"${PIDFILE}")
	[[ -d /proc/${pid} && $(readlink "/proc/${pid}/exe" 2>/dev/null) == *nodeinit* ]] && echo "${pid}"
	return 0
}

in_node() {
	local pid
	pid=$(node_pid)
	[[ -n ${pid} ]] || die "no node runs: hack/cluster.sh up"
	nsenter --target "${pid}" --mount --net --pid --uts -- "$@"
}

node_kubectl() {
	KUBECONFIG=${KUBECONFIG_FILE} "$(kubernetes_bin)/kubectl" "$@"
}

# --- certificates and configuration (written by `up`, on the host) ---

cert() {
	local name=$1 subject=$2 ca=$3 ext=${4:-}
	openssl req -new -newkey rsa:2048 -nodes -keyout "${PKI}/${name}.key" -subj "${subject}" \
		-out "${PKI}/${name}.csr" 2>/dev/null
	local args=(-req -in "${PKI}/${name}.csr" -CA "${PKI}/${ca}.crt" -CAkey "${PKI}/${ca}.key"
		-CAcreateserial -days 3650 -out "${PKI}/${name}.crt")
	if [[ -n ${ext} ]]; then
		printf '%s\n' "${ext}" >"${PKI}/${name}.ext"
		args+=(-extfile "${PKI}/${name}.ext")
	fi
	openssl x509 "${args[@]}" 2>/dev/null
	rm -f "${PKI}/${name}.csr"
}

ca() {
	openssl req -x509 -new -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$2" \
		-keyout "${PKI}/$1.key" -out "${PKI}/$1.crt" 2>/dev/null
}

# write_pki makes the certificates and the tokens, and each of nodes
# nodes' kubeconfigs: the first node's components reach the API server on
# 127.0.0.1, the workers' at the first node's address.
write_pki() {
	local nodes=$1
	rm -rf "${PKI}"
	mkdir -p "${PKI}"
	ca ca kubevirt-qcow2-node-ca
	ca front-proxy-ca kubevirt-qcow2-front-proxy-ca
	cert apiserver "/CN=kube-apiserver" ca \
		"subjectAltName=IP:127.0.0.1,IP:${FIRST_NODE_IP},IP:${KUBERNETES_SERVICE_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" ca "extendedKeyUsage=clientAuth"
	cert front-proxy-client "/CN=front-proxy-client" front-proxy-ca "extendedKeyUsage=clientAuth"
	openssl genrsa -out "${PKI}/sa.key" 2048 2>/dev/null
	openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
	# Static tokens: the node is private to this machine, and tokens need
	# no signing round trip per component.
	local admin kubelet server i
	admin=$(openssl rand -hex 16)
	printf '%s,admin,admin,"system:masters"\n' "${admin}" >"${PKI}/tokens.csv"
	kubeconfig "${KUBECONFIG_FILE}" "https://${FIRST_NODE_IP}:6443" "${admin}"
	for ((i = 0; i < nodes; i++)); do
		node_vars "${i}"
		kubelet=$(openssl rand -hex 16)
		printf '%s,system:node:%s,kubelet-%s,"system:nodes"\n' "${kubelet}" "${NODE_NAME}" "${i}" >>"${PKI}/tokens.csv"
		server=https://127.0.0.1:6443
		((i == 0)) || server=https://${FIRST_NODE_IP}:6443
		mkdir -p "${ETC}"
		kubeconfig "${ETC}/admin.kubeconfig" "${server}" "${admin}"
		kubeconfig "${ETC}/kubelet.kubeconfig" "${server}" "${kubelet}"
	done
	node_vars 0
}

kubeconfig() {
	local file=$1 server=$2 token=$3
	cat >"${file}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ${FIRST_NODE}
  cluster:
    server: ${server}
    certificate-authority-data: $(base64 -w0 "${PKI}/ca.crt")
users:
- name: admin
  user:
    token: ${token}
contexts:
- name: ${FIRST_NODE}
  context: {cluster: ${FIRST_NODE}, user: admin}
current-context: ${FIRST_NODE}
EOF
	chmod 0600 "${file}"
}

write_config() {
	mkdir -p "${ETC}/cni" "${LOGS}"
	cat >"${ETC}/containerd.toml" <<EOF
version = 2
root = "${NODE_DIR}/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which this machine's
  # bounding set lacks: runc would fail every container.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    BinaryName = "${NODE_PACKAGES}/usr/sbin/runc"
    SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${NODE_PACKAGES}/usr/lib/cni"
    conf_dir = "${ETC}/cni"
EOF
	cat >"${ETC}/cni/10-pods.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "${POD_CIDR}"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	cat >"${ETC}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /${CGROUP_NAME}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
protectKernelDefaults: false
oomScoreAdj: 0
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${PKI}/ca.crt}
authorization: {mode: Webhook}
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
EOF
	cat >"${ETC}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: ${ETC}/admin.kubeconfig}
hostnameOverride: ${NODE_NAME}
mode: iptables
clusterCIDR: ${CLUSTER_CIDR}
# Pods on one bridge reach each other's services: without br_netfilter the
# reply would bypass the DNAT.
iptables: {masqueradeAll: true}
# Global conntrack sysctls stay as the host has them.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
oomScoreAdj: 0
EOF
}

# --- inside the node's namespaces ---

# Daemons started by the node script, stopped in reverse order.
NODE_DAEMONS=()

start_daemon() {
	local name=$1
	shift
	"$@" >"${LOGS}/${name}.log" 2>&1 &
	NODE_DAEMONS+=("$!")
	echo "${name} $!" >>"${LOGS}/daemons"
}

stop_daemons() {
	local i
	for ((i = ${#NODE_DAEMONS[@]} - 1; i >= 0; i--)); do
		kill -TERM "${NODE_DAEMONS[i]}" 2>/dev/null || true
		wait "${NODE_DAEMONS[i]}" 2>/dev/null || true
	done
}

wait_for() {
	local what=$1 seconds=$2
	shift 2
	local deadline=$((SECONDS + seconds))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "${what} not ready after ${seconds}s"
		sleep 0.5
	done
}

node_mounts() {
	mount --make-rprivate /
	mount -t tmpfs -o mode=0755 tmpfs /run
	# /var/run is a link to /run on Debian; the names KubeVirt uses resolve.
	mkdir -p /run/containerd /run/lock
	mkdir -p "${NODE_DIR}/varlib/upper" "${NODE_DIR}/varlib/work" "${NODE_DIR}/varlog"
	mount -t overlay overlay \
		-o "lowerdir=/var/lib,upperdir=${NODE_DIR}/varlib/upper,workdir=${NODE_DIR}/varlib/work" /var/lib
	# Loop devices made inside the node over its files (a CSI driver's
	# volumes) show this overlay's device number and the node's paths.
	stat -c %D /var/lib >"${NODE_DIR}/varlib.dev"
	mkdir -p "${SHARED_STORAGE}" /var/lib/csi-loop
	mount --bind "${SHARED_STORAGE}" /var/lib/csi-loop
	mount --bind "${NODE_DIR}/varlog" /var/log
	# A new network namespace keeps showing the host's /sys/class/net until
	# sysfs is mounted again; the cgroup mounts are carried over.
	local aside="${NODE_DIR}/cgroup-aside"
	mkdir -p "${aside}"
	mount --rbind /sys/fs/cgroup "${aside}"
	mount -t sysfs sysfs /sys
	mount --rbind "${aside}" /sys/fs/cgroup
	umount -l "${aside}"
	# KubeVirt names /var/lib/kubelet; its pods' mounts propagate through it.
	# Shared only now: the lazy unmount above would have propagated.
	mkdir -p /var/lib/kubelet
	mount --bind /var/lib/kubelet /var/lib/kubelet
	mount --make-rshared /
	# kubelet sets these global sysctls; it writes files of ours instead.
	local kv file
	mkdir -p "${NODE_DIR}/sysctl"
	for kv in kernel/panic=10 kernel/panic_on_oops=1 vm/overcommit_memory=1 vm/panic_on_oom=0 \
		kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
		file="${NODE_DIR}/sysctl/${kv%%=*}"
		mkdir -p "$(dirname "${file}")"
		echo "${kv#*=}" >"${file}"
		mount --bind "${file}" "/proc/sys/${kv%%=*}"
	done
}

# The first node's eth0 leads to the host, a worker's to the nodes'
# bridge in the first node (which up makes and routes). Pods reach each
# other unmasqueraded; what leaves the pod network is masqueraded on its
# node, and what leaves the first node for the host is masqueraded again:
# the host knows only the first node's address.
node_network() {
	local deadline=$((SECONDS + 30)) gateway=${HOST_IP}
	((NODE_INDEX == 0)) || gateway=${NODES_NET}.1
	until ip link show eth0 >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "the host never gave the node its veth"
		sleep 0.1
	done
	hostname "${NODE_NAME}"
	ip link set lo up
	ip addr add "${NODE_IP}/24" dev eth0
	ip link set eth0 up
	ip route add default via "${gateway}" dev eth0 onlink
	echo 1 >/proc/sys/net/ipv4/ip_forward
	iptables -t nat -A POSTROUTING -s "${POD_CIDR}" ! -d "${CLUSTER_CIDR}" -j MASQUERADE
	((NODE_INDEX != 0)) || iptables -t nat -A POSTROUTING -s "${NODES_NET}.0/24" -o eth0 -j MASQUERADE
}

# The control plane, on the first node only.
control_plane() {
	local kube=$1
	start_daemon etcd "${ETCD}" --data-dir "${CLUSTER_DIR}/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --unsafe-no-fsync
	wait_for etcd 30 curl -fsS http://127.0.0.1:2379/health
	start_daemon kube-apiserver "${kube}/kube-apiserver" \
		--etcd-servers=http://127.0.0.1:2379 \
		--bind-address=0.0.0.0 --secure-port=6443 --advertise-address="${FIRST_NODE_IP}" \
		--service-cluster-ip-range="${SERVICE_CIDR}" \
		--tls-cert-file="${PKI}/apiserver.crt" --tls-private-key-file="${PKI}/apiserver.key" \
		--client-ca-file="${PKI}/ca.crt" --token-auth-file="${PKI}/tokens.csv" \
		--service-account-key-file="${PKI}/sa.pub" --service-account-signing-key-file="${PKI}/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--kubelet-client-certificate="${PKI}/apiserver-kubelet-client.crt" \
		--kubelet-client-key="${PKI}/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP \
		--authorization-mode=Node,RBAC --allow-privileged=true --enable-aggregator-routing=true \
		--requestheader-client-ca-file="${PKI}/front-proxy-ca.crt" \
		--requestheader-allowed-names=front-proxy-client \
		--requestheader-extra-headers-prefix=X-Remote-Extra- \
		--requestheader-group-headers=X-Remote-Group --requestheader-username-headers=X-Remote-User \
		--proxy-client-cert-file="${PKI}/front-proxy-client.crt" \
		--proxy-client-key-file="${PKI}/front-proxy-client.key" \
		--profiling=false
	wait_for kube-apiserver 120 "${kube}/kubectl" --kubeconfig "${ETC}/admin.kubeconfig" get --raw /readyz
	start_daemon kube-controller-manager "${kube}/kube-controller-manager" \
		--kubeconfig="${ETC}/admin.kubeconfig" --bind-address=127.0.0.1 \
		--service-account-private-key-file="${PKI}/sa.key" --root-ca-file="${PKI}/ca.crt" \
		--cluster-signing-cert-file="${PKI}/ca.crt" --cluster-signing-key-file="${PKI}/ca.key" \
		--use-service-account-credentials --leader-elect=false --profiling=false
	start_daemon kube-scheduler "${kube}/kube-scheduler" \
		--kubeconfig="${ETC}/admin.kubeconfig" --bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

node_main() {
	local kube
	kube=$(kubernetes_bin)
	export PATH="${NODE_PACKAGES}/usr/bin:${NODE_PACKAGES}/usr/sbin:${PATH}"
	trap 'stop_daemons; exit 0' TERM INT
	: >"${LOGS}/daemons"
	node_mounts
	node_network
	((NODE_INDEX != 0)) || control_plane "${kube}"
	start_daemon containerd containerd --config "${ETC}/containerd.toml"
	# containerd's own API answers before its CRI server is initialized;
	# kubelet exits if it starts in between.
	wait_for containerd 30 "${CLUSTER_DIR}/bin/criready" /run/containerd/containerd.sock
	start_daemon kubelet "${kube}/kubelet" --config="${ETC}/kubelet.yaml" \
		--kubeconfig="${ETC}/kubelet.kubeconfig" --root-dir=/var/lib/kubelet \
		--node-ip="${NODE_IP}" --hostname-override="${NODE_NAME}"
	start_daemon kube-proxy "${kube}/kube-proxy" --config="${ETC}/kube-proxy.yaml"
	touch "${NODE_DIR}/node.started"
	# One component exiting ends the node: a half node is not a node.
	local status=0
	wait -n || status=$?
	log "a node component exited (status ${status}); see ${LOGS}/daemons and its log"
	stop_daemons
	exit 1
}

# --- on the host ---

# The cgroups kubelet made under our root, deepest first, in every hierarchy.
remove_cgroups() {
	local root dir _
	for root in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		[[ -d ${root}${CGROUP_NAME} ]] || continue
		for _ in $(seq 50); do
			while IFS= read -r dir; do
				rmdir "${dir}" 2>/dev/null || true
			done < <(find "${root}${CGROUP_NAME}" -depth -type d)
			[[ -d ${root}${CGROUP_NAME} ]] || break
			sleep 0.1
		done
		[[ ! -d ${root}${CGROUP_NAME} ]] || log "warning: cgroup ${root}${CGROUP_NAME} still busy"
	done
}

make_cgroups() {
	local root
	for root in /sys/fs/cgroup/*/; do
		[[ -d ${root} && ! -L ${root%/} ]] || continue
		[[ -f ${root}cgroup.procs ]] || continue
		mkdir -p "${root}${CGROUP_NAME}"
		if [[ -f ${root}cpuset.cpus ]]; then
			cat "${root}cpuset.cpus" >"${root}${CGROUP_NAME}/cpuset.cpus"
			cat "${root}cpuset.mems" >"${root}${CGROUP_NAME}/cpuset.mems"
		fi
	done
}

# Loop devices whose backing files live in the cluster's directory, or in
# the node's /var/lib overlay, whose device number the node recorded.
remove_loop_devices() {
	local line overlay=""
	if [[ -s ${NODE_DIR}/varlib.dev ]]; then
		overlay=$(printf '[%04x]:' "0x$(<"${NODE_DIR}/varlib.dev")")
	fi
	while IFS= read -r line; do
		remove_loop_device "${line%%:*}"
	done < <(losetup -a | grep -F -e "(${CLUSTER_DIR}/" ${overlay:+-e ": ${overlay}"} || true)
}

# remove_loop_device detaches a loop device, and first the loop devices
# over it: kubelet locks a Block volume it maps to a pod with one, which a
# kubelet stopped before it unmapped leaves holding the device open.
remove_loop_device() {
	local dev=$1 line
	while IFS= read -r line; do
		losetup -d "${line%%:*}" 2>/dev/null || true
	done < <(losetup -j "${dev}" 2>/dev/null || true)
	losetup -d "${dev}" 2>/dev/null || true
}

# Loop devices over the files of the nodes' shared storage, whichever node
# attached them (by inode: each shows the path its node named).
remove_shared_loop_devices() {
	local file line
	for file in "${SHARED_STORAGE}"/volumes/*; do
		[[ -f ${file} ]] || continue
		while IFS= read -r line; do
			remove_loop_device "${line%%:*}"
		done < <(losetup -j "${file}" || true)
	done
}

# stop_node ends the node of node_vars and what it leaves on the host.
stop_node() {
	local pid
	pid=$(node_pid)
	if [[ -n ${pid} ]]; then
		kill -TERM "${pid}" 2>/dev/null || true
		local i
		for i in $(seq 100); do
			[[ -d /proc/${pid} ]] || break
			sleep 0.2
		done
		# PID 1 gone: the kernel kills everything else in the namespace.
		kill -KILL "${pid}" 2>/dev/null || true
		while [[ -d /proc/${pid} ]]; do sleep 0.1; done
	fi
	rm -f "${PIDFILE}" "${NODE_DIR}/node.started"
	remove_loop_devices
	rm -f "${NODE_DIR}/varlib.dev"
	remove_cgroups
}

# Workers first: the first node holds their links and the API server.
down() {
	local i
	for i in $(known_nodes | sort -rn); do
		node_vars "${i}"
		stop_node
		# The host end of the node's veth (HOST_VETH for the first), left
		# on the host when an up failed before moving it.
		ip link del "${CLUSTER_NAME}-node${i}" 2>/dev/null || true
	done
	node_vars 0
	remove_shared_loop_devices
}

status() {
	local i running
	running=$(running_nodes)
	if [[ -z ${running} ]]; then
		echo "down"
		return 1
	fi
	for i in ${running}; do
		node_vars "${i}"
		echo "up: node ${NODE_NAME} (nodeinit PID $(node_pid))"
	done
	node_vars 0
	echo "kubeconfig: ${KUBECONFIG_FILE}"
	echo "logs: ${LOGS}"
	node_kubectl get nodes 2>&1 || true
}

fail_up() {
	log "error: $*"
	log "logs: ${LOGS} (node.log and one log per component; workers' under ${CLUSTER_DIR}/nodes)"
	down
	exit 1
}

# start_node starts the node of node_vars in namespaces of its own and
# gives it its eth0: one end of a veth pair whose other end is host (the
# host's network namespace, for the first node) or, for a worker, the
# nodes' bridge in the first node's.
start_node() {
	local host=$1
	mkdir -p "${LOGS}"
	make_cgroups
	setsid unshare --mount --pid --net --uts --fork --mount-proc --propagation private \
		"${CLUSTER_DIR}/bin/nodeinit" "${QCOW2_ROOT}/hack/cluster.sh" _node "${NODE_INDEX}" \
		</dev/null >"${LOGS}/node.log" 2>&1 &
	local unshare_pid=$! pid='' i
	for i in $(seq 100); do
		pid=$(awk '{print $1}' "/proc/${unshare_pid}/task/${unshare_pid}/children" 2>/dev/null || true)
		[[ -n ${pid} ]] && break
		sleep 0.05
	done
	[[ -n ${pid} ]] || fail_up "the namespaces of node ${NODE_NAME} did not start"
	echo "${pid}" >"${PIDFILE}"
	ip link add "${host}" type veth peer name eth0 netns "${pid}" || fail_up "cannot create the veth pair of ${NODE_NAME}"
}

# wait_node waits until the node of node_vars runs its components, then
# gives it the pause image and waits until it is Ready.
wait_node() {
	local deadline=$1
	until [[ -f ${NODE_DIR}/node.started ]]; do
		[[ -n $(node_pid) ]] || fail_up "node ${NODE_NAME} exited"
		((SECONDS < deadline)) || fail_up "the components of node ${NODE_NAME} did not start in ${UP_TIMEOUT}s"
		sleep 0.5
	done
	in_node "${NODE_CTR[@]}" images import "${CLUSTER_DIR}/pause.tar" >/dev/null || fail_up "cannot import the pause image"
	until node_kubectl wait --for=condition=Ready "node/${NODE_NAME}" --timeout=5s >/dev/null 2>&1; do
		[[ -n $(node_pid) ]] || fail_up "node ${NODE_NAME} exited"
		((SECONDS < deadline)) || fail_up "node ${NODE_NAME} was not Ready after ${UP_TIMEOUT}s"
		sleep 1
	done
}

# add_worker starts worker i and joins it to the first node's bridge;
# the first node routes to the worker's pods.
add_worker() {
	local i=$1 first
	node_vars 0
	first=$(node_pid)
	node_vars "${i}"
	start_node "${CLUSTER_NAME}-node${i}"
	ip link set "${CLUSTER_NAME}-node${i}" netns "${first}" || fail_up "cannot move the link of ${NODE_NAME}"
	nsenter --target "${first}" --net -- sh -ec "
		ip link set ${CLUSTER_NAME}-node${i} master ${NODES_BRIDGE} up
		ip route add ${POD_CIDR} via ${NODE_IP}" || fail_up "cannot join ${NODE_NAME} to the nodes' bridge"
}

up() {
	[[ ${EUID} -eq 0 ]] || die "run as root: the node needs namespaces, mounts and cgroups"
	local start=${SECONDS} kube missing=() nodes=${CLUSTER_NODES:-1} running i
	[[ ${nodes} =~ ^[1-9]$ ]] || die "CLUSTER_NODES=${nodes}: from 1 to 9 nodes"
	running=$(running_nodes | wc -l)
	if ((running == nodes)) && node_kubectl get --raw /readyz >/dev/null 2>&1; then
		log "already up"
		status
		return 0
	fi
	((running == 0)) || log "${running} nodes run, ${nodes} asked: starting again"
	down # what a killed run left
	kube=$(kubernetes_bin)
	local need
	for need in "${ETCD}" "${NODE_PACKAGES}/usr/bin/containerd" "${NODE_PACKAGES}/usr/sbin/runc" \
		"${NODE_PACKAGES}/usr/lib/cni/bridge" /usr/sbin/iptables /usr/bin/openssl /usr/bin/curl; do
		[[ -x ${need} ]] || missing+=("${need}")
	done
	[[ ${#missing[@]} -eq 0 ]] || die "missing ${missing[*]}: run make deps"
	if ip -o addr show | grep -qw "${HOST_IP}"; then
		die "${HOST_IP} is already used on this host; set CLUSTER_HOST_IP and CLUSTER_NODE_IP"
	fi

	# Fresh nodes every time; only their image stores outlive them.
	rm -rf "${CLUSTER_DIR}/etcd" "${SHARED_STORAGE}"
	for ((i = 0; i < nodes; i++)); do
		node_vars "${i}"
		rm -rf "${NODE_DIR}/varlib" "${NODE_DIR}/varlog" "${LOGS}" "${ETC}"
	done
	node_vars 0
	mkdir -p "${CLUSTER_DIR}"
	write_pki "${nodes}"
	for ((i = 0; i < nodes; i++)); do
		node_vars "${i}"
		write_config
	done
	node_vars 0
	local nodeinit="${CLUSTER_DIR}/bin/nodeinit"
	(cd "${QCOW2_ROOT}" && CGO_ENABLED=0 go build -trimpath -o "${CLUSTER_DIR}/bin/" ./hack/nodeinit ./hack/criready ./cmd/oci-image) ||
		fail_up "cannot build hack/nodeinit, hack/criready and cmd/oci-image"
	# nodeinit without arguments is the pod sandboxes' pause program.
	"${CLUSTER_DIR}/bin/oci-image" --out "${CLUSTER_DIR}/images/pause" --ref "${PAUSE_IMAGE}" \
		--archive "${CLUSTER_DIR}/pause.tar" --file "${nodeinit}:/pause:0755" --entrypoint /pause \
		--user 65535 >/dev/null || fail_up "cannot build the pause image"

	start_node "${HOST_VETH}"
	ip addr add "${HOST_IP}/24" dev "${HOST_VETH}"
	ip link set "${HOST_VETH}" up
	local deadline=$((SECONDS + UP_TIMEOUT))
	until node_kubectl get --raw /readyz >/dev/null 2>&1; do
		[[ -n $(node_pid) ]] || fail_up "the node exited"
		((SECONDS < deadline)) || fail_up "the API server was not ready after ${UP_TIMEOUT}s"
		sleep 0.5
	done
	if ((nodes > 1)); then
		in_node sh -ec "
			ip link add ${NODES_BRIDGE} type bridge
			ip addr add ${NODES_NET}.1/24 dev ${NODES_BRIDGE}
			ip link set ${NODES_BRIDGE} up" || fail_up "cannot make the nodes' bridge"
		for ((i = 1; i < nodes; i++)); do
			add_worker "${i}"
		done
	fi
	for ((i = 0; i < nodes; i++)); do
		node_vars "${i}"
		wait_node "${deadline}"
	done
	node_vars 0
	# The first node is the control plane too; virt-operator runs only there.
	node_kubectl label --overwrite "node/${NODE_NAME}" node-role.kubernetes.io/control-plane= >/dev/null
	log "$(running_nodes | wc -l) node(s) Ready in $((SECONDS - start))s"
	echo "export KUBECONFIG=${KUBECONFIG_FILE}"
}

# KubeVirt as users install it: the operator manifest, then a KubeVirt CR;
# emulation only without KVM. The patched KubeVirt gets the CR of
# deploy/kubevirt with our feature gates, both applied server-side; stock
# KubeVirt (built by `hack/kubevirt-images.sh stock`) its release's CR, no
# gates, created with `kubectl create` as KubeVirt's installation guide
# does (verb).
install_kubevirt() {
	local start=${SECONDS} images=$1 manifest=$2 cr=$3 verb=$4 c archives=()
	[[ -n $(node_pid) ]] || die "no node runs: hack/cluster.sh up"
	[[ -f ${manifest} ]] || kubevirt_failed "no ${manifest}: run make images (stock: make images-stock)"
	for c in virt-operator virt-api virt-controller virt-handler virt-launcher; do
		archives+=("${images}/${c}.tar")
	done
	import_archives "${archives[@]}" || kubevirt_failed "cannot import KubeVirt's images from ${images}"
	log "images imported in $((SECONDS - start))s"
	# Applied server-side, not client-side: a later server-side apply of
	# deploy/kubevirt would take over every field client-side apply had
	# recorded, and applying it again would remove the ones it lacks
	# (docs/install.md, Roll back).
	local how=("${verb}")
	[[ ${verb} != apply ]] || how=(apply --server-side)
	node_kubectl "${how[@]}" -f "${manifest}" >/dev/null
	node_kubectl -n kubevirt rollout status deployment/virt-operator --timeout=300s ||
		kubevirt_failed "virt-operator did not become ready"
	# The CR under docs/install.md's field manager: run again after an
	# install by the docs (another gate list), this resets the gates to
	# deploy/kubevirt's instead of failing on a conflict.
	[[ ${verb} != apply ]] || how+=(--field-manager=kubevirt-qcow2)
	node_kubectl "${how[@]}" -f "${cr}" >/dev/null
	local why
	if why=$(emulation_reason); then
		log "VMs run emulated (KubeVirt's useEmulation): ${why}"
		node_kubectl -n kubevirt patch kubevirt kubevirt --type merge \
			-p '{"spec":{"configuration":{"developerConfiguration":{"useEmulation":true}}}}' >/dev/null
	fi
	node_kubectl -n kubevirt wait kubevirt/kubevirt --for=condition=Available --timeout=600s >/dev/null ||
		kubevirt_failed "KubeVirt did not become Available"
	log "KubeVirt Available in $((SECONDS - start))s"
}

# emulation_reason says why VMs must run emulated here, and fails when
# they can use KVM. Without /dev/vhost-net KubeVirt cannot schedule a VM on
# the pod network unless it runs emulated. A /dev/kvm may still not boot a
# stock Linux kernel (nested KVM of some hosts stops it in its first
# seconds): the Linux test guest is booted with KVM once, and the outcome
# kept in the cache, keyed by the kernel and the guest.
emulation_reason() {
	if [[ ! -c /dev/kvm ]]; then
		echo "this host has no /dev/kvm"
		return 0
	fi
	if [[ ! -c /dev/vhost-net ]]; then
		echo "this host has no /dev/vhost-net, which KubeVirt asks of every VM on the pod network unless VMs run emulated"
		return 0
	fi
	local image
	image=$("${QCOW2_ROOT}/hack/guest-image.sh") || {
		echo "the Linux test guest could not be built to probe KVM (hack/guest-image.sh)"
		return 0
	}
	local key
	key=$(printf '%s %s' "$(uname -r)" "${image}" | sha256sum | cut -c1-16)
	local probe="${QCOW2_CACHE}/kvm-probe/${key}"
	if [[ ! -f ${probe} ]]; then
		mkdir -p "${probe%/*}"
		local dir
		dir=$(mktemp -d)
		qemu-img create -q -f qcow2 -F raw -b "${image}" "${dir}/disk.qcow2"
		timeout 60 qemu-system-x86_64 -machine q35,accel=kvm -cpu host -m 256 -display none -no-reboot \
			-drive "file=${dir}/disk.qcow2,format=qcow2,if=virtio" -serial "file:${dir}/serial" \
			-smbios "type=1,serial=pieces=0" >/dev/null 2>&1 &
		local qemu=$! deadline=$((SECONDS + 60))
		until grep -q 'KQG DONE' "${dir}/serial" 2>/dev/null || ((SECONDS > deadline)) || ! kill -0 "${qemu}" 2>/dev/null; do
			sleep 1
		done
		# Written whole: a cluster beside this one may read it.
		if grep -q 'KQG DONE' "${dir}/serial" 2>/dev/null; then
			echo ok >"${probe}.$$"
		else
			echo "/dev/kvm does not boot a stock Linux kernel on this host (probed with the Linux test guest)" >"${probe}.$$"
		fi
		mv "${probe}.$$" "${probe}"
		kill "${qemu}" 2>/dev/null || true
		wait "${qemu}" 2>/dev/null || true
		rm -rf "${dir}"
	fi
	[[ $(cat "${probe}") != ok ]] && cat "${probe}"
}

# A failed install keeps what explains it in the node's log directory, then
# stops the node like a failed `up`.
kubevirt_failed() {
	local pod
	log "error: $*"
	node_kubectl -n kubevirt get kubevirt,pods -o wide >&2 || true
	node_kubectl -n kubevirt get events --sort-by=.lastTimestamp >"${LOGS}/kubevirt-events.log" 2>&1 || true
	for pod in $(node_kubectl -n kubevirt get pods -o name 2>/dev/null); do
		node_kubectl -n kubevirt logs "${pod}" --all-containers --prefix >"${LOGS}/kubevirt-${pod#pod/}.log" 2>&1 || true
	done
	log "logs: ${LOGS} (kubevirt-*.log: KubeVirt's pods and events; one log per node component)"
	down
	exit 1
}

# Into every running node's containerd: each has its own image store. An
# image is also named by its digest, as a pull from its registry names it:
# kubelet then reports that name as the container's image, and KubeVirt
# pins a migration target's containerDisks to it.
# tag_image IMAGE NAME: every node's IMAGE is NAME too, as a new release
# pushed under another tag would be (both fully qualified references).
tag_image() {
	local i
	for i in $(running_nodes); do
		node_vars "${i}"
		in_node "${NODE_CTR[@]}" images tag --force "$1" "$2" >/dev/null || die "cannot name $1 $2 on ${NODE_NAME}"
	done
	node_vars 0
}

import_archives() {
	local archive i out line ref repo
	for archive in "$@"; do
		[[ -f ${archive} ]] || { log "no image archive ${archive}"; return 1; }
		archive=$(realpath "${archive}")
		for i in $(running_nodes); do
			node_vars "${i}"
			out=$(in_node "${NODE_CTR[@]}" images import "${archive}") ||
				{ log "importing ${archive} into ${NODE_NAME} failed"; return 1; }
			while IFS= read -r line; do
				[[ ${line} =~ ^unpacking\ ([^ ]+)\ \((sha256:[0-9a-f]+)\) ]] || continue
				# registry:port/repo:tag@digest -> registry:port/repo@digest
				ref=${BASH_REMATCH[1]} repo=${BASH_REMATCH[1]}
				[[ ${repo##*/} != *:* ]] || repo=${repo%:*}
				in_node "${NODE_CTR[@]}" images tag --force "${ref}" "${repo}@${BASH_REMATCH[2]}" >/dev/null
			done <<<"${out}"
		done
	done
	node_vars 0
}

# exec_in runs a command in the first node, or in the node --node names.
exec_in() {
	if [[ ${1:-} == --node ]]; then
		local i
		for i in $(running_nodes); do
			node_vars "${i}"
			[[ ${NODE_NAME} != "${2:-}" ]] || break
		done
		[[ ${NODE_NAME} == "${2:-}" ]] || die "no node ${2:-} runs"
		shift 2
	fi
	in_node "$@"
}

main() {
	local cmd=${1:-}
	node_vars 0
	[[ $# -gt 0 ]] && shift
	case "${cmd}" in
	up) up ;;
	down) down ;;
	status) status ;;
	kubevirt)
		install_kubevirt "${QCOW2_ROOT}/_out/images" "${KUBEVIRT_OUT}/manifests/kubevirt-operator.yaml" \
			"${QCOW2_ROOT}/deploy/kubevirt/kubevirt.yaml" apply
		;;
	kubevirt-stock)
		local stock="${QCOW2_CACHE}/kubevirt-stock-${KUBEVIRT_VERSION}"
		install_kubevirt "${stock}/images" "${stock}/manifests/kubevirt-operator.yaml" "${stock}/manifests/kubevirt-cr.yaml" create
		;;
	kubectl) node_kubectl "$@" ;;
	import) import_archives "$@" ;;
	exec) exec_in "$@" ;;
	tag)
		[[ $# == 2 ]] || usage
		tag_image "$@"
		;;
	_node)
		node_vars "$1"
		node_main
		;;
	*) usage ;;
	esac
}

main "$@"
