//! The VM-wide state KVM emulates in the kernel: both PICs, the IOAPIC, the
//! PIT and the KVM clock.

use kvm_bindings::{
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, kvm_clock_data, kvm_irqchip, kvm_pit_state2,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

use super::TemplateError;

const CHIPS: [u32; 3] = [KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQCHIP_IOAPIC];

#[derive(Serialize, Deserialize)]
pub struct MachineState {
    chips: Vec<kvm_irqchip>,
    pit: kvm_pit_state2,
    clock: kvm_clock_data,
}

fn kvm(step: &'static str) -> impl Fn(kvm_ioctls::Error) -> TemplateError {
    move |source| TemplateError::Kvm { step, source }
}

impl MachineState {
    pub fn save(vm: &VmFd) -> Result<MachineState, TemplateError> {
        let mut chips = Vec::new();
        for chip_id in CHIPS {
            let mut chip = kvm_irqchip { chip_id, ..Default::default() };
            vm.get_irqchip(&mut chip).map_err(kvm("get interrupt controller"))?;
            chips.push(chip);
        }
        Ok(MachineState {
            chips,
            pit: vm.get_pit2().map_err(kvm("get PIT"))?,
            clock: vm.get_clock().map_err(kvm("get clock"))?,
        })
    }

    /// Sets the state on a VM whose irqchip and PIT exist already.
    pub fn restore(&self, vm: &VmFd) -> Result<(), TemplateError> {
        vm.set_pit2(&self.pit).map_err(kvm("set PIT"))?;
        // The guest's clock goes on from the moment it was saved; the flags
        // describe the saving host's clock and mean nothing here.
        let clock = kvm_clock_data { flags: 0, ..self.clock };
        vm.set_clock(&clock).map_err(kvm("set clock"))?;
        for chip in &self.chips {
            vm.set_irqchip(chip).map_err(kvm("set interrupt controller"))?;
        }
        Ok(())
    }
}
