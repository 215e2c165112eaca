//! What a device keeps of its own in a template, beyond what its transport
//! saves (registers and queues). A device with state declares the state's
//! type and how it is taken and given back (`Persist`), and forwards its
//! `VirtioDevice::save_state` and `restore_state` hooks here; a device
//! without state leaves the hooks' defaults, which save nothing and refuse
//! a template that holds something for it.
//!
//! No device keeps state of its own today (they are made so on purpose: see
//! `fs/boot.rs`), so outside the tests only the defaults' part is used.
#![cfg_attr(
    not(test),
    expect(dead_code, reason = "the place for the first device with state; only the tests' device has some")
)]

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A device that keeps state of its own across a template.
pub trait Persist {
    /// Everything the device must have back to go on where it was saved.
    type State: Serialize + DeserializeOwned;
    /// Called while the device's worker is parked (see `worker::park_all`),
    /// so state the worker shares holds still.
    fn save(&self) -> Self::State;
    /// Called before the device is activated again.
    fn restore(&mut self, state: Self::State) -> Result<(), PersistError>;
}

/// One device's own state in a template: none, or its `Persist::State`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceState(Option<serde_json::Value>);

#[derive(Debug, Error)]
pub enum PersistError {
    // The causes are in the messages: templates report errors as one line.
    #[error("cannot encode its state: {0}")]
    Encode(serde_json::Error),
    #[error("its state in the template does not fit it: {0}")]
    Decode(serde_json::Error),
    #[error("the template holds state for it, and it keeps none")]
    Unexpected,
    #[error("the template holds no state for it")]
    Missing,
    #[error("its state in the template is refused: {0}")]
    Invalid(String),
}

impl DeviceState {
    /// The state of a device that keeps none.
    pub const NONE: DeviceState = DeviceState(None);

    /// Takes `device`'s state.
    pub fn save<P: Persist>(device: &P) -> Result<DeviceState, PersistError> {
        serde_json::to_value(device.save()).map(|v| DeviceState(Some(v))).map_err(PersistError::Encode)
    }

    /// Gives this state back to `device`.
    pub fn restore<P: Persist>(&self, device: &mut P) -> Result<(), PersistError> {
        let value = self.0.clone().ok_or(PersistError::Missing)?;
        device.restore(P::State::deserialize(value).map_err(PersistError::Decode)?)
    }

    /// Accepts this state for a device that keeps none.
    pub fn expect_none(&self) -> Result<(), PersistError> {
        match self.0 {
            None => Ok(()),
            Some(_) => Err(PersistError::Unexpected),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::devices::mmio::MmioTransport;
    use crate::vmm::devices::virtio::{ActivateError, Activation, VIRTIO_F_VERSION_1, VirtioDevice};
    use crate::vmm::template::SavedDevice;
    use vm_memory::{GuestAddress, GuestMemoryMmap};
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    /// A device that counts the requests it served and remembers the last
    /// guest's name for itself.
    #[derive(Default)]
    struct Counter {
        served: u64,
        name: String,
    }

    #[derive(Serialize, Deserialize)]
    struct CounterState {
        served: u64,
        name: String,
    }

    impl Persist for Counter {
        type State = CounterState;
        fn save(&self) -> CounterState {
            CounterState { served: self.served, name: self.name.clone() }
        }
        fn restore(&mut self, state: CounterState) -> Result<(), PersistError> {
            if state.name.is_empty() {
                return Err(PersistError::Invalid("no name".into()));
            }
            self.served = state.served;
            self.name = state.name;
            Ok(())
        }
    }

    impl VirtioDevice for Counter {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[]
        }
        fn features(&self) -> u64 {
            VIRTIO_F_VERSION_1
        }
        fn read_config(&self, _offset: u64, data: &mut [u8]) {
            data.fill(0);
        }
        fn activate(&mut self, _activation: Activation) -> Result<(), ActivateError> {
            Ok(())
        }
        fn save_state(&self) -> Result<DeviceState, PersistError> {
            DeviceState::save(self)
        }
        fn restore_state(&mut self, state: &DeviceState) -> Result<(), PersistError> {
            state.restore(self)
        }
    }

    /// A device without state of its own: the hooks' defaults.
    struct Plain;

    impl VirtioDevice for Plain {
        fn device_type(&self) -> u32 {
            4
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[]
        }
        fn features(&self) -> u64 {
            VIRTIO_F_VERSION_1
        }
        fn read_config(&self, _offset: u64, data: &mut [u8]) {
            data.fill(0);
        }
        fn activate(&mut self, _activation: Activation) -> Result<(), ActivateError> {
            Ok(())
        }
    }

    /// Through the JSON a template's state file holds, as `Saved` writes it.
    fn through_json(state: &DeviceState) -> DeviceState {
        serde_json::from_slice(&serde_json::to_vec(state).unwrap()).unwrap()
    }

    #[test]
    fn a_device_state_round_trips_through_the_hooks() {
        let device: Box<dyn VirtioDevice> = Box::new(Counter { served: 7, name: "guest".into() });
        let saved = through_json(&device.save_state().unwrap());
        let mut fresh = Counter::default();
        fresh.restore_state(&saved).unwrap();
        assert_eq!((fresh.served, fresh.name.as_str()), (7, "guest"));
    }

    #[test]
    fn a_device_state_goes_through_its_transport_into_a_template_and_back() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let transport = |device: Counter| {
            MmioTransport::new(Box::new(device), mem.clone(), EventFd::new(EFD_NONBLOCK).unwrap()).unwrap()
        };
        // As `Recorder::save` and `vmm::restore` do it.
        let recorded = transport(Counter { served: 7, name: "guest".into() });
        let saved = SavedDevice { transport: recorded.save(), state: recorded.save_device_state().unwrap() };
        let saved: SavedDevice = serde_json::from_slice(&serde_json::to_vec(&saved).unwrap()).unwrap();
        let mut resumed = transport(Counter::default());
        assert_ne!(resumed.save_device_state().unwrap(), saved.state);
        resumed.restore(&saved.transport).unwrap();
        resumed.restore_device_state(&saved.state).unwrap();
        assert_eq!(resumed.save_device_state().unwrap(), saved.state);
    }

    #[test]
    fn a_device_refuses_a_state_that_does_not_fit_it() {
        let mut fresh = Counter::default();
        let err = fresh.restore_state(&DeviceState::NONE).unwrap_err();
        assert!(matches!(err, PersistError::Missing), "{err}");
        let saved = DeviceState::save(&Counter::default()).unwrap();
        assert!(matches!(fresh.restore_state(&saved), Err(PersistError::Invalid(_))));
        let other = through_json(&DeviceState(Some(serde_json::json!({"served": "many"}))));
        assert!(matches!(fresh.restore_state(&other), Err(PersistError::Decode(_))));
        assert_eq!(fresh.served, 0, "a refused state changes nothing");
    }

    #[test]
    fn a_device_without_state_saves_none_and_refuses_some() {
        let mut plain = Plain;
        let saved = through_json(&plain.save_state().unwrap());
        assert_eq!(saved, DeviceState::NONE);
        plain.restore_state(&saved).unwrap();
        let counted = DeviceState::save(&Counter { served: 1, name: "guest".into() }).unwrap();
        assert!(matches!(plain.restore_state(&counted), Err(PersistError::Unexpected)));
    }
}
