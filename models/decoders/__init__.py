"""Decoders: one module per output layout, each declaring its one ``Decoder`` as ``DECODER``.

``registry`` finds the modules of this package and gives every decoder by name; the shared
pieces are ``base`` (the interface, the parameters, the binding to a model's outputs),
``nms`` (IoU, class-aware NMS, turning candidates into detections) and ``recognition``
(what the rules that pick a decoder for an ONNX without a manifest see and say).
"""
