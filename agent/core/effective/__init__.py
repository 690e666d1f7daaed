"""Fleet configuration: one YAML tree for many devices, rendered into one device's config.

A fleet is a file, or a directory whose ``*.yaml``/``*.yml`` files (dot-files skipped) are
read in name order as if they were one file::

    defaults:                     # an AgentConfig mapping
      publish: {endpoint: "tcp://*:5556"}
    groups:                       # applied in file order, every group whose match holds
      - name: orin-nano
        match:                    # every key given must hold; empty or absent: all devices
          hostname: "cam-*"       # shell glob on the hostname
          module: orin-nano       # exact module name
          labels: {site: berlin}  # every label given must be equal
        config: {backend: {type: tensorrt}}
    devices:                      # by device id
      cam-001:
        hostname: cam-001         # default: the id
        module: orin-nano
        labels: {site: berlin}
        config: {source: {fps: 15}}

Unknown and duplicate keys anywhere are errors; a key left empty (null) other than ``name``
or a label is as if absent. Group names and device ids are unique across all files (a
duplicate from another file names both places). ``defaults`` may appear in several files
of a directory; they are applied in name order.

Layers, lowest first: ``device_id`` (the device's id, unless a layer sets it) → defaults →
every matching group in file order → the device's entry → a local overlay file (a plain
AgentConfig YAML, e.g. written by the tuning tool) → environment variables
``EDGE_AGENT__<SECTION>__<KEY>[__<SUBKEY>...]=<value>`` (parts split at ``__`` and
lowercased; the value is a YAML scalar, so ``30`` is an int and ``true`` a bool; a value
starting with ``[`` or ``{`` is a YAML flow list/mapping).

Merge rules:

* mappings merge key by key, deeply (a later layer adds and overrides keys, it never
  removes one);
* lists are replaced whole by a later layer, never concatenated (``deadline.ladder``,
  ``backend.onnxruntime.providers``, ``source.patterns``);
* scalars (null included) are replaced;
* ``source`` and ``sources`` exclude each other: a layer that sets one drops the other
  from the layers below (fleet defaults for one camera, a device with four);
* a section with a ``type`` (``source``, ``backend``) whose type changes in a later layer
  is replaced as a whole, not merged: keys of one source type are not valid for another.
  A section without ``type`` is the union's first member (``synthetic``, ``auto``), so
  ``source: {type: video, ...}`` over a typeless source replaces it too; a later layer
  without ``type`` merges into whatever type is in force.

``${VAR}`` and ``${VAR:-default}`` are substituted inside every scalar of every config layer
(not in the environment-variable layer), from the ``env`` mapping (default ``os.environ``);
``$${`` stands for a literal ``${``. A substituted scalar is resolved again as YAML, so
``"${FPS:-30}"`` is the int 30 (an empty result stays the empty string). ``${VAR}`` unset
without a default is an error.

Values keep their YAML nodes, with file and line, through the merge; the merged tree is
built into an ``AgentConfig`` by ``configload.Builder``, so every error names the original
file, line and key path of the value that is wrong."""
