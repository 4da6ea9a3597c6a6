"""detcore: Mask R-CNN style detection and instance segmentation with compiled NMS/ROIAlign."""

__version__ = "0.1.0"
