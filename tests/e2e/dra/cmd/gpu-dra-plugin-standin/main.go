// Command gpu-dra-plugin-standin is a STAND-IN for NVIDIA's DRA kubelet plugin (the gpu-kubelet-plugin of
// kubernetes-sigs/dra-driver-nvidia-gpu), for the gpu-webhook e2e suite's real node, which has no GPU and no driver.
//
// It is a real DRA kubelet plugin built on k8s.io/dynamic-resource-allocation (kubeletplugin, resourceslice): it
// registers with the kubelet, publishes one ResourceSlice for its node under driver gpu.nvidia.com, and the kubelet
// asks it to prepare and unprepare the claims the real scheduler allocated from that slice. What is made up:
//
//   - the devices: given by --devices, shaped like NVIDIA's full-GPU devices (DRA-FACTS section 3.3): attributes
//     type "gpu", productName, architecture, uuid, brand, driverVersion, cudaDriverVersion and cudaComputeCapability
//     (versions), capacity memory. No NVML is read;
//   - preparing a claim: it writes a CDI spec (JSON, as Kubernetes' DRA test driver writes it) that only sets
//     environment variables naming each allocated device (DRA_STANDIN_<DEVICE>_UUID=<uuid>, ...), and, as NVIDIA's
//     driver does in every claim's spec, NVIDIA_VISIBLE_DEVICES=void, so that the NVIDIA Container Runtime (a Pod
//     with runtimeClassName nvidia) does not also inject the devices a CUDA image's NVIDIA_VISIBLE_DEVICES=all names.
//     NVIDIA's driver injects device nodes, driver libraries and its sharing (MPS, time-slicing) and MIG set-up too.
//
// Every log line says STAND-IN.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const (
	// cdiKind is the CDI kind of the specs this plugin writes ("<vendor>/<class>"), NVIDIA's driver's vendor and
	// class for claims.
	cdiKind = "k8s.gpu.nvidia.com/claim"
	domain  = "gpu.nvidia.com" // the qualified attributes' domain, NVIDIA's driver name
)

// gpu is one stand-in device as given on the command line (--devices, a JSON list).
type gpu struct {
	Name                  string `json:"name"`
	ProductName           string `json:"productName"`
	Architecture          string `json:"architecture"`
	Brand                 string `json:"brand"`
	UUID                  string `json:"uuid"`
	Memory                string `json:"memory"`
	CudaComputeCapability string `json:"cudaComputeCapability"`
}

type plugin struct {
	driverName    string
	cdiDir        string
	driverVersion string
	cudaVersion   string
	devices       map[string]gpu
	cancel        context.CancelFunc

	mu sync.Mutex
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	nodeName := flag.String("node-name", "", "the node whose kubelet this plugin serves (required)")
	driverName := flag.String("driver-name", domain, "the DRA driver name the devices are published under")
	registrarDir := flag.String("registrar-dir", kubeletplugin.KubeletRegistryDir,
		"the kubelet's plugin registration directory (<kubelet root-dir>/plugins_registry)")
	dataDir := flag.String("plugin-data-dir", "",
		"this plugin's directory for its socket (default <kubelet plugins dir>/<driver name>)")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where the CDI specs of prepared claims are written")
	devicesJSON := flag.String("devices", "", `the devices, a JSON list of {"name", "productName", "architecture", `+
		`"brand", "uuid", "memory", "cudaComputeCapability"}`)
	driverVersion := flag.String("driver-version", "580.159.4", "the driverVersion attribute (semver)")
	cudaVersion := flag.String("cuda-driver-version", "13.0.0", "the cudaDriverVersion attribute (semver)")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *nodeName, *driverName, *registrarDir, *dataDir, *cdiDir, *devicesJSON,
		*driverVersion, *cudaVersion); err != nil {
		klog.ErrorS(err, "STAND-IN DRA plugin failed")
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, driverName, registrarDir, dataDir, cdiDir, devicesJSON, driverVersion,
	cudaVersion string) error {
	if nodeName == "" {
		return errors.New("--node-name is required")
	}
	var gpus []gpu
	if err := json.Unmarshal([]byte(devicesJSON), &gpus); err != nil || len(gpus) == 0 {
		return fmt.Errorf("--devices must be a non-empty JSON list of devices (%v)", err)
	}
	if dataDir == "" {
		dataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, driverName)
	}
	for _, dir := range []string{registrarDir, dataDir, cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("read --kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	p := &plugin{driverName: driverName, cdiDir: cdiDir, driverVersion: driverVersion, cudaVersion: cudaVersion,
		devices: map[string]gpu{}, cancel: cancel}
	slice := resourceslice.Slice{}
	for _, g := range gpus {
		device, err := p.device(g)
		if err != nil {
			return err
		}
		p.devices[g.Name] = g
		slice.Devices = append(slice.Devices, device)
	}

	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.KubeClient(client),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.RegistrarDirectoryPath(registrarDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	klog.InfoS("STAND-IN for NVIDIA's DRA driver started (no GPU: devices and CDI edits are made up)",
		"driver", driverName, "node", nodeName, "registrarDir", registrarDir, "pluginDataDir", dataDir,
		"cdiDir", cdiDir, "devices", len(slice.Devices))

	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{slice}},
	}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish the ResourceSlice: %w", err)
	}
	klog.InfoS("STAND-IN DRA plugin: ResourceSlice handed to the slice controller", "pool", nodeName)
	<-ctx.Done()
	klog.InfoS("STAND-IN DRA plugin stopping")
	return nil
}

// device is the ResourceSlice entry of g, with the attributes and capacity NVIDIA's driver publishes for a full GPU.
func (p *plugin) device(g gpu) (resourceapi.Device, error) {
	memory, err := resource.ParseQuantity(g.Memory)
	if err != nil {
		return resourceapi.Device{}, fmt.Errorf("device %q: memory %q: %w", g.Name, g.Memory, err)
	}
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	ver := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &s} }
	return resourceapi.Device{
		Name: g.Name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":                  str("gpu"),
			"uuid":                  str(g.UUID),
			"productName":           str(g.ProductName),
			"brand":                 str(g.Brand),
			"architecture":          str(g.Architecture),
			"driverVersion":         ver(p.driverVersion),
			"cudaDriverVersion":     ver(p.cudaVersion),
			"cudaComputeCapability": ver(g.CudaComputeCapability),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: memory}},
	}, nil
}

var notEnvChar = regexp.MustCompile(`[^A-Za-z0-9]`)

// cdiSpec is the JSON CDI spec one prepared claim gets: one CDI device per allocated device, editing only the
// environment.
type cdiSpec struct {
	Version        string      `json:"cdiVersion"`
	Kind           string      `json:"kind"`
	ContainerEdits cdiEdits    `json:"containerEdits"`
	Devices        []cdiDevice `json:"devices"`
}

type cdiEdits struct {
	Env []string `json:"env"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

func (p *plugin) specPath(uid types.UID) string {
	return filepath.Join(p.cdiDir, fmt.Sprintf("%s-standin-%s.json", p.driverName, uid))
}

// PrepareResourceClaims writes each claim's CDI spec and returns its CDI device ids (<kind>=<device>).
func (p *plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (
	map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	result := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		result[claim.UID] = p.prepare(claim)
	}
	return result, nil
}

func (p *plugin) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	// The spec's own edits apply with any of its devices: NVIDIA's driver sets NVIDIA_VISIBLE_DEVICES=void there
	// "to avoid the nvidia-container-runtime honoring it in addition to the underlying runtime honoring CDI".
	spec := cdiSpec{Version: "0.5.0", Kind: cdiKind, ContainerEdits: cdiEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}}
	var prepared []kubeletplugin.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != p.driverName {
			continue
		}
		g, ok := p.devices[r.Device]
		if !ok {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: device %q is not one of this plugin's",
				claim.Namespace, claim.Name, r.Device)}
		}
		prefix := "DRA_STANDIN_" + strings.ToUpper(notEnvChar.ReplaceAllString(r.Device, "_"))
		d := cdiDevice{Name: fmt.Sprintf("%s-%s", claim.UID, r.Device)}
		d.ContainerEdits.Env = []string{
			prefix + "_UUID=" + g.UUID,
			prefix + "_PRODUCT=" + g.ProductName,
			prefix + "_CLAIM=" + claim.Namespace + "/" + claim.Name + "/" + r.Request,
		}
		spec.Devices = append(spec.Devices, d)
		prepared = append(prepared, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool,
			DeviceName: r.Device, CDIDeviceIDs: []string{cdiKind + "=" + d.Name}})
	}
	if len(spec.Devices) == 0 {
		return kubeletplugin.PrepareResult{}
	}
	data, err := json.Marshal(spec)
	if err == nil {
		path := p.specPath(claim.UID)
		tmp := path + ".tmp"
		if err = os.WriteFile(tmp, data, 0o644); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("write the CDI spec: %w", err)}
	}
	klog.InfoS("STAND-IN DRA plugin prepared a claim (CDI spec with environment variables only)",
		"claim", klog.KObj(claim), "uid", claim.UID, "devices", len(prepared), "cdiSpec", p.specPath(claim.UID))
	return kubeletplugin.PrepareResult{Devices: prepared}
}

// UnprepareResourceClaims removes the claims' CDI specs; a claim that is not prepared is no error.
func (p *plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (
	map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	result := map[types.UID]error{}
	for _, claim := range claims {
		err := os.Remove(p.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		result[claim.UID] = err
		klog.InfoS("STAND-IN DRA plugin unprepared a claim", "claim", claim.String(), "err", err)
	}
	return result, nil
}

// HandleError logs background errors (publishing the ResourceSlice) and stops the plugin on a fatal one.
func (p *plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.ErrorS(err, "STAND-IN DRA plugin: "+msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		p.cancel()
	}
}
