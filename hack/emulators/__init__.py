"""Emulators of NVIDIA's operand images for the local kwok cluster (started by hack/cluster.sh).

kwok gives a simulated node no kubelet and a pod no process; these modules provide both for the pods
the operator deploys, so that the cluster does at the API level and in time what a real GPU node
does. The shared core:

* :mod:`.emulator` watches and wiring, :mod:`.kubelet` a pod's life on its node, :mod:`.process`
  a running container and the program registry, :mod:`.shell` the shell the pods run,
  :mod:`.vfs` a container's view of files, :mod:`.node` a node's emulated host, :mod:`.images` what
  the images contain, :mod:`.gpus` the simulated hardware, :mod:`.profile` timing, :mod:`.cluster`
  tokens, IPs and informers, :mod:`.api` the API client, :mod:`.nfd` nfd-master.

One module per operand image registers the programs it emulates (see hack/README.md for what each
does and the NVIDIA source lines it follows).
"""
